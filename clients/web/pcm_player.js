// Gapless playback of PCM16 chunks through WebAudio.
//
// Each chunk becomes one AudioBuffer started exactly where the previous one ends
// (`nextTime`), so consecutive chunks join without a click or a gap. When the
// queue has run dry (the next chunk came late) playback restarts a little ahead of
// now; inside one sentence that is an audible gap, counted as an underrun.
//
//   ctx.currentTime ─┬──────────────┬──────────┬─────────▶
//                    │ chunk 1      │ chunk 2  │ chunk 3
//                  start        nextTime   nextTime

// How far ahead of "now" a fresh start is scheduled: enough that the first
// samples are not in the past by the time the audio thread sees them.
const START_LEAD_S = 0.05;

export class PcmPlayer {
  constructor() {
    this.ctx = null;
    this.nextTime = 0;
    this.sources = new Set();
    this.carry = null; // an odd trailing byte of the last chunk (half a sample)
    this.underruns = 0;
    this.scheduledSeconds = 0;
  }

  /** Create/resume the AudioContext; call from a user gesture (autoplay rules). */
  ensureContext() {
    if (!this.ctx) this.ctx = new AudioContext();
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  /**
   * Schedule one chunk of PCM16 little-endian mono at `sampleRate`; returns its seconds.
   * `continuing`: the chunk is not the first of its sentence, so a gap before it is an underrun.
   */
  push(buffer, sampleRate, continuing = false) {
    const ctx = this.ensureContext();
    let bytes = new Uint8Array(buffer);
    if (this.carry !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const n = bytes.length / 2;
    if (n === 0) return 0;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const audio = ctx.createBuffer(1, n, sampleRate);
    const out = audio.getChannelData(0);
    for (let i = 0; i < n; i += 1) out[i] = view.getInt16(2 * i, true) / 32768;
    const source = ctx.createBufferSource();
    source.buffer = audio;
    source.connect(ctx.destination);
    const now = ctx.currentTime;
    if (this.nextTime < now) {
      if (continuing && this.nextTime > 0) this.underruns += 1;
      this.nextTime = now + START_LEAD_S;
    }
    source.start(this.nextTime);
    this.nextTime += audio.duration;
    this.scheduledSeconds += audio.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    return audio.duration;
  }

  /** Cut everything scheduled or playing now. */
  stop() {
    for (const source of this.sources) {
      source.onended = null;
      source.stop();
    }
    this.sources.clear();
    this.carry = null;
    this.nextTime = 0;
  }

  /** Sources scheduled or playing. */
  get playing() {
    return this.sources.size;
  }
}

// A world.v1 `h264` stream decoded with WebCodecs: one VideoDecoder per session.
//
//   binary frame (one access unit, Annex B) ─▶ EncodedVideoChunk (key: holds an IDR)
//       ─▶ VideoDecoder ─▶ VideoFrame ─▶ the player draws it and closes it
//
// A delta frame only decodes on top of every frame before it since the last key frame.
// After a gap the page cannot show deltas until the next IDR, so it asks the server for
// one (`{"type": "keyframe"}`) and drops deltas until it comes. A gap is:
//
//   - a delta frame with no key frame decoded before it (also: the session's first frame),
//   - a chunk_index that does not follow the last one (0 after a reset is the server's IDR),
//   - a decode error (the VideoDecoder closes itself; a new one is configured).
//
// Frames are fed in arrival order; no B-frames come, so each output follows its input and
// is matched to it by timestamp (a frame counter, so timestamps always increase).

import { isKeyFrame } from "./annexb.js";
import { RateMeter } from "./rate_meter.js";

// A key frame asked for and not come within this many chunks is asked for again (the
// server makes at most one IDR per chunk, so asking more often gains nothing).
const ASK_AGAIN_AFTER_CHUNKS = 8;

/** Why this browser cannot decode `codec` with WebCodecs; null when it can. */
export async function h264Unsupported(codec) {
  if (typeof VideoDecoder === "undefined") return "this browser has no WebCodecs VideoDecoder";
  try {
    const { supported } = await VideoDecoder.isConfigSupported({ codec, optimizeForLatency: true });
    return supported ? null : `this browser's VideoDecoder does not support ${codec}`;
  } catch (err) {
    return `VideoDecoder.isConfigSupported(${codec}) failed: ${err}`;
  }
}

export class H264Decoder {
  /**
   * @param {string} codec  session.created's `codec` (e.g. "avc1.42E01F")
   * @param {() => void} askKeyFrame  sends `{"type": "keyframe"}`
   * @param {(reason: string) => void} onUnsupported  the browser cannot decode `codec`
   */
  constructor(codec, askKeyFrame, onUnsupported) {
    this.codec = codec;
    this.askKeyFrame = askKeyFrame;
    this.decodeTimes = new RateMeter();
    this.pending = new Map(); // timestamp -> {resolve, startedAt}
    this.nextTimestamp = 0;
    this.lastChunkIndex = -1;
    this.needKey = true; // no key frame decoded since the last gap
    this.askedAt = null; // chunk_index of the last key-frame request in this gap
    this.decoder = null;
    this.closed = false;
    this.stats = { codec, framesDecoded: 0, deltasDropped: 0, decodeErrors: 0, keyFrameRequests: 0,
      lastDecodeError: null, unsupported: null };
    // Frames wait for the support check; `then` callbacks run in order, so they stay in order.
    this.ready = h264Unsupported(codec).then((why) => {
      if (why) {
        this.stats.unsupported = why;
        onUnsupported(why);
      } else if (!this.closed) {
        this.decoder = this.#newDecoder();
      }
    });
  }

  /** Decode one chunk's access units; resolves with the VideoFrames that came out. */
  decode(header, payloads) {
    return this.ready
      .then(() => Promise.all(this.#feed(header, payloads)))
      .then((frames) => frames.filter((f) => f !== null));
  }

  /** Mean decode time (ms) over the last second; null when nothing was decoded. */
  get decodeMs() {
    return this.decodeTimes.mean();
  }

  close() {
    this.closed = true;
    this.#dropPending();
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = null;
  }

  #feed(header, payloads) {
    if (this.closed || !this.decoder) return [];
    const follows = this.lastChunkIndex < 0 || header.chunk_index === this.lastChunkIndex + 1
      || header.chunk_index === 0;
    this.lastChunkIndex = header.chunk_index;
    if (!follows) this.#gap(header.chunk_index);
    const frames = [];
    for (const payload of payloads) {
      const data = new Uint8Array(payload);
      const key = isKeyFrame(data);
      if (!key && this.needKey) {
        this.stats.deltasDropped += 1;
        this.#gap(header.chunk_index);
        continue;
      }
      const timestamp = this.nextTimestamp++;
      frames.push(new Promise((resolve) => this.pending.set(timestamp, { resolve, startedAt: performance.now() })));
      try {
        this.decoder.decode(new EncodedVideoChunk({ type: key ? "key" : "delta", timestamp, data }));
        if (key) {
          this.needKey = false;
          this.askedAt = null;
        }
      } catch (err) {
        // A closed decoder (its error callback has run) or a chunk it refuses.
        this.#failed(err, header.chunk_index);
      }
    }
    return frames;
  }

  #newDecoder() {
    const decoder = new VideoDecoder({
      output: (frame) => this.#output(frame),
      error: (err) => this.#failed(err, this.lastChunkIndex),
    });
    // Annex B input: no `description`; SPS and PPS come in band before each IDR.
    decoder.configure({ codec: this.codec, optimizeForLatency: true });
    return decoder;
  }

  #output(frame) {
    const entry = this.pending.get(frame.timestamp);
    if (!entry) {
      frame.close(); // its chunk was given up (an error, or the session closed)
      return;
    }
    this.pending.delete(frame.timestamp);
    this.decodeTimes.add(performance.now() - entry.startedAt);
    this.stats.framesDecoded += 1;
    entry.resolve(frame);
  }

  #failed(err, chunkIndex) {
    if (this.closed) return;
    this.stats.decodeErrors += 1;
    this.stats.lastDecodeError = String(err);
    this.#dropPending();
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = this.#newDecoder();
    this.#gap(chunkIndex);
  }

  /** Drop deltas until the next key frame, and ask for one (again after a while). */
  #gap(chunkIndex) {
    this.needKey = true;
    if (this.askedAt !== null && chunkIndex >= this.askedAt && chunkIndex - this.askedAt < ASK_AGAIN_AFTER_CHUNKS) return;
    this.askedAt = chunkIndex;
    this.stats.keyFrameRequests += 1;
    this.askKeyFrame();
  }

  #dropPending() {
    for (const entry of this.pending.values()) entry.resolve(null);
    this.pending.clear();
  }
}

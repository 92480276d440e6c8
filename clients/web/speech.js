// The speech panel: one tts.v1 session over one WebSocket (protocols/tts_v1.py).
//
// Out: session.update {voice, sample_rate, format, speed}, input.text {text} for
// each finished sentence as it is typed, input.done on Enter, response.cancel on
// stop. In: session.updated, audio.start, binary PCM16 frames, audio.done,
// response.done, response.cancelled, session.closed, error.
//
// A dropped socket is opened again by itself (reconnect.js: backoff, and the closes not
// worth a retry); the reconnect button opens one at once. Text sent on the old socket
// and not yet spoken is lost with it (tts.v1 keeps nothing across connections).
//
// Everything the tests look at lives in `state` (window.demo.tts).

import { $, describeError, showError } from "./dom.js";
import { connect, randomId } from "./net.js";
import { PcmPlayer } from "./pcm_player.js";
import { Reconnector, noRetryReason } from "./reconnect.js";
import { TextStreamer } from "./sentences.js";

const PATH = "/v1/realtime/tts";
const SAMPLE_RATES = [22050, 24000];

export class SpeechPanel {
  constructor(models) {
    this.model = models.find((m) => m.kind === "tts" && m.available) || null;
    this.missing = models.find((m) => m.kind === "tts" && !m.available) || null;
    this.ws = null;
    this.player = new PcmPlayer();
    this.streamer = new TextStreamer();
    this.cancelling = false; // response.cancel sent, response.cancelled not yet back
    // Time to first audio: from the first input.text of an utterance to the next
    // audio frame received.
    this.utteranceOpen = false; // some text of the current utterance has been sent
    this.firstTextAt = 0;
    this.ttfaPending = false;
    this.sentenceChunks = 0; // chunks of the sentence now arriving
    this.lines = new Map(); // "utterance:sentence" -> <li>
    this.socketError = null; // the last server error code on this socket (noRetryReason reads it)
    this.greeted = false; // the socket's first session.updated has come
    this.retry = new Reconnector(() => {
      this.state.retries += 1;
      this.#open();
    }, (text) => {
      this.el.status.textContent = text;
    });
    this.state = {
      available: false,
      reason: null, // why the panel is off
      connected: false,
      voice: null,
      voices: [],
      sampleRate: null, // of session.updated, then of each audio.start
      chunks: 0, // binary audio frames received (not while cancelling)
      bytes: 0,
      samples: 0,
      seconds: 0, // audio scheduled for playback
      chunksAfterCancel: 0, // frames that were in flight when stop was pressed (dropped)
      sentencesStarted: 0,
      sentencesDone: 0,
      responsesDone: 0,
      cancelled: 0, // response.cancelled received
      textsSent: [], // every input.text sent, in order
      donesSent: 0,
      ttfaMs: null, // time to first audio of the last utterance
      underruns: 0,
      playing: 0, // AudioBufferSources scheduled or playing
      lastError: null,
      errors: [],
      closeCode: null,
      retries: 0, // connections opened again by the page itself
      retryStopped: null, // why the last drop is not retried (noRetryReason), or null
    };
    this.el = {
      unavailable: $("speech-unavailable"),
      voice: $("speech-voice"),
      speed: $("speech-speed"),
      stop: $("speech-stop"),
      reconnect: $("speech-reconnect"),
      text: $("speech-text"),
      status: $("speech-status"),
      ttfa: $("speech-ttfa"),
      chunks: $("speech-chunks"),
      seconds: $("speech-seconds"),
      log: $("speech-log"),
      error: $("speech-error"),
    };
  }

  start() {
    if (!this.model) {
      // The registry's reasons may already start with the same words.
      const reason = (this.missing?.reason || "the server lists no text-to-speech model").replace(
        /^TTS unavailable:\s*/i,
        "",
      );
      this.state.reason = reason;
      this.el.unavailable.textContent = `TTS unavailable: ${reason}`;
      this.el.unavailable.hidden = false;
      for (const el of [this.el.voice, this.el.speed, this.el.stop, this.el.text]) el.disabled = true;
      this.el.status.textContent = "unavailable";
      return;
    }
    this.state.available = true;
    // WebAudio may only start after a gesture: the first key or click in the panel.
    const panel = $("speech-panel");
    panel.addEventListener("pointerdown", () => this.player.ensureContext());
    panel.addEventListener("keydown", () => this.player.ensureContext());
    this.el.text.addEventListener("input", () => this.#typed());
    this.el.text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.#flush();
      }
    });
    this.el.stop.addEventListener("click", () => this.stop());
    this.el.voice.addEventListener("change", () => this.send({ type: "session.update", voice: this.el.voice.value }));
    this.el.speed.addEventListener("change", () => {
      const speed = Number.parseFloat(this.el.speed.value);
      if (Number.isFinite(speed)) this.send({ type: "session.update", speed });
    });
    this.el.reconnect.addEventListener("click", () => this.#open());
    setInterval(() => this.#renderHud(), 250);
    this.#open();
  }

  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  /** Barge-in: silence now, tell the server to drop the rest, start a fresh utterance. */
  stop() {
    this.player.stop();
    this.streamer.reset();
    this.el.text.value = "";
    this.utteranceOpen = false;
    this.ttfaPending = false;
    if (this.send({ type: "response.cancel" })) this.cancelling = true;
  }

  // ------------------------------------------------------------------ typing
  #typed() {
    for (const text of this.streamer.update(this.el.text.value)) this.#sendText(text);
  }

  #flush() {
    for (const text of this.streamer.flush(this.el.text.value)) this.#sendText(text);
    // Enter on an empty box ends nothing.
    if (this.utteranceOpen && this.send({ type: "input.done" })) this.state.donesSent += 1;
    this.el.text.value = "";
    this.utteranceOpen = false;
  }

  #sendText(text) {
    if (!this.send({ type: "input.text", text })) {
      this.#fail({ code: "connection", message: "not connected: text not sent" });
      return;
    }
    this.state.textsSent.push(text);
    if (!this.utteranceOpen) {
      this.utteranceOpen = true;
      this.firstTextAt = performance.now();
      this.ttfaPending = true;
    }
  }

  // ------------------------------------------------------------------ socket
  #open() {
    this.retry.cancel(); // this is the retry (or a click came first)
    this.socketError = null;
    this.greeted = false;
    this.state.retryStopped = null;
    // The reconnect button stays until a socket opens: no flicker while retries fail.
    this.el.status.textContent = "connecting";
    this.cancelling = false;
    // tts.v1 has no session id; a fresh routing id per socket keeps it on one replica.
    const ws = connect(PATH, randomId("tts"));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      this.state.connected = true;
      this.el.reconnect.hidden = true;
      this.state.closeCode = null;
      const update = { type: "session.update", format: "pcm16", sample_rate: preferredRate(this.model) };
      const speed = Number.parseFloat(this.el.speed.value);
      if (Number.isFinite(speed)) update.speed = speed;
      if (this.el.voice.value) update.voice = this.el.voice.value;
      this.send(update);
    };
    ws.onmessage = (e) => {
      if (ws !== this.ws) return;
      if (typeof e.data === "string") this.#message(JSON.parse(e.data));
      else this.#audio(e.data);
    };
    ws.onclose = (e) => {
      if (ws !== this.ws) return;
      this.state.connected = false;
      this.state.closeCode = e.code;
      this.player.stop();
      // The utterance under way ended with its socket: the next text starts a new one.
      this.utteranceOpen = false;
      this.ttfaPending = false;
      this.#fail({ code: "connection", message: `speech connection lost (close code ${e.code})` });
      // The button stays: during the wait it reconnects at once.
      this.el.reconnect.hidden = false;
      const why = noRetryReason(e.code, this.socketError);
      if (why) {
        this.state.retryStopped = why;
        this.el.status.textContent = `disconnected: ${why}`;
      } else {
        this.retry.schedule();
      }
    };
  }

  #message(msg) {
    const s = this.state;
    switch (msg.type) {
      case "session.updated":
        if (!this.greeted) {
          // The first on this socket: it works, so the error of the one before is over.
          this.greeted = true;
          this.retry.succeeded();
          s.lastError = null;
          showError(this.el.error, "");
        }
        Object.assign(s, { voice: msg.voice, voices: msg.voices, sampleRate: msg.sample_rate });
        this.#fillVoices(msg.voices, msg.voice);
        this.el.status.textContent = `ready: ${msg.voice} @ ${msg.sample_rate} Hz`;
        return;
      case "audio.start":
        if (this.cancelling) return;
        s.sentencesStarted += 1;
        s.sampleRate = msg.sample_rate;
        this.sentenceChunks = 0;
        this.#line(msg, "speaking", msg.text);
        return;
      case "audio.done":
        if (this.cancelling) return;
        s.sentencesDone += 1;
        this.#line(msg, "done");
        return;
      case "response.done":
        s.responsesDone += 1;
        return;
      case "response.cancelled":
        this.cancelling = false;
        s.cancelled += 1;
        for (const li of this.el.log.querySelectorAll('li[data-state="speaking"]')) li.dataset.state = "cancelled";
        return;
      case "session.closed":
        this.el.status.textContent = "closed";
        return;
      case "error":
        this.socketError = msg.code;
        this.#fail(msg);
        return;
      default:
        this.#fail({ code: "protocol", message: `unknown server message ${msg.type}` });
    }
  }

  #audio(buffer) {
    const s = this.state;
    // Frames already in flight when stop was pressed: the person asked for silence.
    if (this.cancelling) {
      s.chunksAfterCancel += 1;
      return;
    }
    if (this.ttfaPending) {
      this.ttfaPending = false;
      s.ttfaMs = performance.now() - this.firstTextAt;
    }
    s.chunks += 1;
    s.bytes += buffer.byteLength;
    s.samples += buffer.byteLength >> 1;
    s.seconds += this.player.push(buffer, s.sampleRate || 22050, this.sentenceChunks > 0);
    this.sentenceChunks += 1;
  }

  #fail(msg) {
    this.state.lastError = msg;
    this.state.errors.push(msg);
    showError(this.el.error, describeError(msg));
  }

  // ------------------------------------------------------------------ view
  #line(msg, state, text) {
    const key = `${msg.utterance_index}:${msg.sentence_index}`;
    let li = this.lines.get(key);
    if (!li) {
      li = document.createElement("li");
      li.textContent = text ?? "";
      this.lines.set(key, li);
      this.el.log.append(li);
      while (this.el.log.children.length > 50) {
        const first = this.el.log.firstElementChild;
        for (const [k, v] of this.lines) if (v === first) this.lines.delete(k);
        first.remove();
      }
      li.scrollIntoView({ block: "nearest" });
    }
    li.dataset.state = state;
  }

  #fillVoices(voices, current) {
    const names = voices.map((v) => (typeof v === "string" ? v : v.name));
    if ([...this.el.voice.options].map((o) => o.value).join() !== names.join()) {
      this.el.voice.replaceChildren(...names.map((n) => new Option(n, n)));
    }
    this.el.voice.value = current;
  }

  #renderHud() {
    const s = this.state;
    s.playing = this.player.playing;
    s.underruns = this.player.underruns;
    this.el.ttfa.textContent = s.ttfaMs === null ? "–" : `${s.ttfaMs.toFixed(0)} ms`;
    this.el.chunks.textContent = String(s.chunks);
    this.el.seconds.textContent = `${s.seconds.toFixed(1)} s`;
    this.el.stop.disabled = !s.connected;
  }
}

/** The model's own rate when the protocol allows it (no resampling), else 22050. */
function preferredRate(model) {
  const native = model?.voices?.[0]?.sample_rate;
  return SAMPLE_RATES.includes(native) ? native : SAMPLE_RATES[0];
}

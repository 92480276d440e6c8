// A world.v1 session driven in lockstep, frame by frame: the robot panel's camera.
//
// Unlike the world panel (a person holding keys, frames paced by credits), a robot
// decides every frame's keys itself: it sends them as one keys.v1 `script` event and
// gives exactly one credit per scripted frame, so each chunk (one frame) is made under
// the keys chosen for it and nothing runs ahead. Frames come as `rgb8`: the raw pixels
// are the policy's camera image, with no codec in between.
//
//   create (credits 1) ─▶ chunk 0 (start frame)
//   event {script: [k1..kn]} + credit n ─▶ chunks 1..n, frame i made under k_i
//
// Bounded: at most the credited chunks can arrive (one more is a protocol error), and
// chunk indexes must be contiguous; any server `error` or close ends the link with it.

import { describeError } from "./dom.js";
import { connect } from "./net.js";

const PATH = "/v1/realtime/world";
const MAX_CREDITS = 64; // per credit message (protocols/world_v1.py MAX_CREDITS)

export class WorldLinkError extends Error {}

export class WorldLink {
  /**
   * Open a socket and create session `sessionId`; resolves once `session.created` came.
   * @param {{model: string, seed: number, prompt?: string}} options
   */
  static open(sessionId, options) {
    return new Promise((resolve, reject) => {
      const link = new WorldLink(sessionId, options);
      link.onCreated = () => resolve(link);
      link.onFailed = reject;
    });
  }

  constructor(sessionId, { model, seed, prompt }) {
    this.sessionId = sessionId;
    this.created = null; // the session.created message
    this.credited = 1; // chunks the server may still send (session.create's credits)
    this.expected = 0; // the next chunk_index
    this.nextEventId = 1;
    this.ready = []; // chunks received and not yet taken: at most `credited` of them
    this.waiter = null; // {resolve, reject} of next()
    this.header = null; // a chunk header whose frame is due
    this.failed = null;
    this.ws = connect(PATH, sessionId);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => this.#send({
      type: "session.create", session_id: sessionId, model, seed, format: "rgb8", credits: 1,
      ...(prompt ? { prompt } : {}),
    });
    this.ws.onmessage = (e) => (typeof e.data === "string" ? this.#message(JSON.parse(e.data)) : this.#binary(e.data));
    this.ws.onclose = (e) => this.#fail(`world connection closed (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`);
    this.ws.onerror = () => {};
  }

  /** Run one frame per entry of `frames` (each a list of held keys, e.g. ["w", "j"]). */
  play(frames) {
    if (this.failed) throw this.failed;
    if (!frames.length) return;
    this.#send({ type: "event", event_id: this.nextEventId++, controls: [
      { track: "keys", schema: "keys.v1", data: { mode: "script", frames } }] });
    this.credited += frames.length;
    for (let left = frames.length; left > 0; left -= MAX_CREDITS) {
      this.#send({ type: "credit", chunks: Math.min(left, MAX_CREDITS) });
    }
  }

  /** The next chunk: {header, frame: Uint8Array of height*width*3 RGB bytes}. */
  next() {
    if (this.ready.length) return Promise.resolve(this.ready.shift());
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => { this.waiter = { resolve, reject }; });
  }

  /** Close the session and the socket (the server frees the session either way). */
  close() {
    if (!this.failed && this.ws.readyState === WebSocket.OPEN) this.#send({ type: "session.close" });
    this.#fail("world session closed by the page", true);
    this.ws.close(1000);
  }

  #send(msg) {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg));
  }

  #message(msg) {
    switch (msg.type) {
      case "session.created":
        if (msg.frames_per_chunk !== 1) {
          this.#fail(`world ${msg.model} makes ${msg.frames_per_chunk} frames a chunk; the robot observes every frame (1)`);
          return;
        }
        this.created = msg;
        this.onCreated?.();
        return;
      case "chunk":
        if (this.header) return this.#fail(`chunk ${msg.chunk_index} came before the frame of chunk ${this.header.chunk_index}`);
        if (msg.chunk_index !== this.expected) return this.#fail(`chunk ${msg.chunk_index} came, chunk ${this.expected} was due`);
        if (this.credited <= 0) return this.#fail(`chunk ${msg.chunk_index} came without a credit`);
        if (msg.frames !== 1) return this.#fail(`chunk ${msg.chunk_index} has ${msg.frames} frames, 1 expected`);
        this.credited -= 1;
        this.expected += 1;
        this.header = msg;
        return;
      case "event.accepted":
        if (msg.status !== "accepted") this.#fail(`event ${msg.event_id} was ${msg.status}`);
        return;
      case "error":
        return this.#fail(describeError(msg));
      case "session.closed":
        return this.#fail("world session closed by the server");
      default:
        return this.#fail(`unexpected world message ${msg.type}`);
    }
  }

  #binary(data) {
    const header = this.header;
    if (!header) return this.#fail("a frame came outside a chunk");
    this.header = null;
    const frame = new Uint8Array(data);
    if (frame.length !== header.height * header.width * 3) {
      return this.#fail(`chunk ${header.chunk_index}: ${frame.length} bytes, not one ${header.width}x${header.height} rgb8 frame`);
    }
    const chunk = { header, frame };
    const waiter = this.waiter;
    this.waiter = null;
    if (waiter) waiter.resolve(chunk);
    else this.ready.push(chunk);
  }

  #fail(text, quiet = false) {
    if (this.failed) return;
    this.failed = new WorldLinkError(`session ${this.sessionId}: ${text}`);
    this.failed.quiet = quiet;
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.reject(this.failed);
    this.onFailed?.(this.failed);
    if (this.ws.readyState === WebSocket.OPEN && !quiet) this.ws.close(1000);
  }
}

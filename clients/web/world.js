// The world panel: one world.v1 session over one WebSocket.
//
// Messages in (docs/protocols.md): session.created, event.accepted, chunk (+ N
// binary frames), session.reset, session.closed, error. Out: session.create,
// event (keys.v1 state, mouse.v1 deltas, prompt), credit, session.reset, session.close,
// keyframe. A model that takes mouse.v1 gets mouse look on the canvas (mouse.js).
//
// The format menu's h264 is decoded with WebCodecs, and falls back to jpeg where it cannot
// be (frame_format.js); state.formatFallback says why.
//
// A dropped socket is opened again by itself (reconnect.js: backoff, and the closes
// not worth a retry) with a new session under a fresh id, as the reconnect button does;
// not after the person closed the session, and the close button stops a retry under way.
//
// Everything the tests look at lives in `state` (window.demo.world).

import { CreditWindow, INITIAL as INITIAL_CREDITS } from "./credits.js";
import { $, describeError, showError } from "./dom.js";
import { FramePlayer } from "./frames.js";
import { FrameFormat, videoLine } from "./frame_format.js";
import { HeldKeys } from "./keys.js";
import { MOUSE_SCHEMA, PointerLook } from "./mouse.js";
import { connect, randomId } from "./net.js";
import { RateMeter } from "./rate_meter.js";
import { Reconnector, noRetryReason } from "./reconnect.js";

const PATH = "/v1/realtime/world";
const TRAJECTORY_SCHEMA = "lingbot.camera_trajectory.v1";
const SINCE_RESET_KEEP = 100;

export class WorldPanel {
  constructor(models) {
    this.models = models.filter((m) => m.kind === "world");
    this.ws = null;
    this.assembling = null; // {header, payloads} while a chunk's binary frames arrive
    this.pendingCreate = null; // options of a session.create waiting for session.closed
    this.creating = false; // a session.create was sent on this socket and not answered yet
    this.socketSessionId = null; // the session id in the socket's URL (its routing key)
    this.closing = false; // session.close sent: no more events or credits for this session
    this.nextEventId = 1; // strictly increasing for every session this page makes
    this.wanted = false; // the person wants a session: a drop is retried (not after they closed it)
    this.socketError = null; // the last server error code on this socket (noRetryReason reads it)
    this.retry = new Reconnector(() => {
      this.state.retries += 1;
      this.reconnect();
    }, (text) => this.#setStatus(text));
    this.sentAt = new Map(); // event_id -> performance.now() when sent
    this.state = {
      connected: false, // the socket is open
      sessionId: null, // the session on the socket (null: none)
      model: null,
      height: 0,
      width: 0,
      fps: 0,
      chunkIndex: -1, // of the last drawn chunk
      receivedChunkIndex: -1,
      chunksDrawn: 0,
      framesDrawn: 0,
      appliedEventIds: [], // of the last drawn chunk that applied any
      sinceReset: [], // chunk indices drawn since the last create or reset
      resets: 0,
      held: [],
      lastEventId: 0,
      tickMs: null,
      rttMs: null,
      serverCredits: 0, // credits the server holds, by this page's count
      creditWindow: INITIAL_CREDITS, // chunks the server may run ahead of the drawing
      stalls: 0, // frames that were due with none ready
      lastError: null, // the last server `error` message, or {code: "connection", ...}
      errors: [],
      closeCode: null, // of the last unexpected socket close
      retries: 0, // connections opened again by the page itself
      retryStopped: null, // why the last drop is not retried (noRetryReason), or null
      usesPrompts: true, // the selected model's `uses_prompts` (GET /v1/models); unknown: true
      format: null, // the session's frame format (session.created)
      codec: null, // its codec string, for h264
      bytesPerS: 0, // frame bytes received over the last second
      decodeMs: null, // mean decode time of a frame over the last second
      video: null, // the h264 decoder's counts (H264Decoder.stats) while the session is h264
      formatFallback: null, // why the page asked for jpeg instead of h264, or null
    };
    this.el = {
      model: $("world-model"),
      session: $("world-session"),
      seed: $("world-seed"),
      format: $("world-format"),
      connect: $("world-connect"),
      canvas: $("world-canvas"),
      promptForm: $("world-prompt-form"),
      prompt: $("world-prompt"),
      imageRow: $("world-image-row"),
      image: $("world-image"),
      trajectoryForm: $("world-trajectory-form"),
      trajectory: $("world-trajectory"),
      reset: $("world-reset"),
      close: $("world-close"),
      reconnect: $("world-reconnect"),
      error: $("world-error"),
      status: $("hud-status"),
      fps: $("hud-fps"),
      tick: $("hud-tick"),
      rtt: $("hud-rtt"),
      chunk: $("hud-chunk"),
      applied: $("hud-applied"),
      queue: $("hud-queue"),
      held: $("hud-held"),
      video: $("hud-video"),
    };
    this.received = new RateMeter(); // frame bytes
    this.format = new FrameFormat(this.el.format);
    this.credits = new CreditWindow();
    this.player = new FramePlayer(
      this.el.canvas,
      (header) => this.#drawn(header),
      (text) => this.#fail({ code: "decode", message: text }),
      () => {
        this.state.stalls += 1;
        this.credits.stalled();
        this.#topUp();
      },
    );
    this.keys = new HeldKeys((held) => this.#heldChanged(held));
    this.look = new PointerLook(this.el.canvas, (control) => this.sendEvent({ controls: [control] }));
    this.state.mouse = this.look.state;
  }

  /** Resolves once the first session was asked for (after the h264 support check). */
  async start() {
    await this.format.probe();
    this.#fillModels();
    this.el.session.value = randomId("web");
    this.keys.attach(document.querySelector("#world-panel .keypad"));
    this.el.connect.addEventListener("click", () => this.newSession());
    this.el.model.addEventListener("change", () => {
      this.#renderPrompt();
      this.newSession();
    });
    this.el.reset.addEventListener("click", () => this.send({ type: "session.reset" }));
    this.el.close.addEventListener("click", () => {
      // Closed on purpose: a drop from now on is not retried.
      this.wanted = false;
      if (this.state.sessionId) this.closeSession();
      else this.#stopReconnecting();
      this.#renderButtons();
    });
    this.el.reconnect.addEventListener("click", () => this.reconnect());
    this.el.promptForm.addEventListener("submit", (e) => {
      e.preventDefault();
      this.sendEvent({ prompt: this.el.prompt.value });
    });
    // A first image (models with `takes_image`): sent after the next session.create.
    this.imageBytes = null;
    this.imageFormat = "png";
    this.el.image.addEventListener("change", async () => {
      const file = this.el.image.files[0];
      this.imageBytes = file ? await file.arrayBuffer() : null;
      this.imageFormat = file && file.type === "image/jpeg" ? "jpeg" : "png";
    });
    // A named trajectory (models with lingbot.camera_trajectory.v1).
    this.el.trajectoryForm.addEventListener("submit", (e) => {
      e.preventDefault();
      const name = this.el.trajectory.value.trim();
      if (name) this.sendEvent({ controls: [{ track: "camera_trajectory", schema: TRAJECTORY_SCHEMA, data: { mode: "named", name } }] });
    });
    setInterval(() => this.#renderHud(), 250);
    this.#renderHud();
    if (this.el.model.value) this.newSession();
    else this.#fail({ code: "no_model", message: "the server lists no available world model" });
  }

  /** A new socket and session at once (the reconnect button, and a retry when its wait is up). */
  reconnect() {
    // The old session is cleaned up server-side when its socket drops; a fresh
    // id avoids racing that cleanup.
    this.el.session.value = randomId("web");
    this.newSession();
  }

  /** Start a session with the toolbar's settings (closing this socket's session first). */
  newSession() {
    this.wanted = true;
    const options = {
      type: "session.create",
      session_id: this.el.session.value.trim(),
      model: this.el.model.value,
      seed: Number.parseInt(this.el.seed.value, 10) || 0,
      format: this.format.pick(),
      credits: INITIAL_CREDITS,
    };
    this.state.formatFallback = this.format.fallback;
    const prompt = this.el.prompt.value.trim();
    if (prompt) options.prompt = prompt;
    const model = this.models.find((m) => m.name === options.model);
    if (this.imageBytes && model?.takes_image) {
      options.image = { format: this.imageFormat, bytes: this.imageBytes.byteLength };
    }
    // A socket's URL carries the session id a proxy routes on (net.js wsUrl): another
    // id gets a socket of its own, which may land on another replica.
    const sameRoute = options.session_id === this.socketSessionId;
    if (sameRoute && this.ws && this.ws.readyState === WebSocket.OPEN) {
      if (this.state.sessionId || this.creating) {
        // The newest settings win: the live session (or the one still being created, once
        // it is) is closed first, then this create is sent.
        this.pendingCreate = options;
        this.closeSession();
      } else {
        this.#create(options);
      }
      return;
    }
    this.#open(options);
  }

  /** Send one JSON message if the socket is open; false otherwise. */
  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(msg));
    // world.v1: a create with `image` is followed by exactly one binary message, the image.
    if (msg.type === "session.create" && msg.image) this.ws.send(this.imageBytes);
    return true;
  }

  /** Send a session.create; the next one waits until the server has answered it. */
  #create(options) {
    if (this.send(options)) this.creating = true;
  }

  /** Close this socket's session; the socket stays open for the next one. */
  closeSession() {
    if (!this.state.sessionId || this.closing) return;
    // Frames still queued belong to a session that is going away.
    this.player.stop();
    this.player.clear();
    if (this.send({ type: "session.close" })) this.closing = true;
  }

  /** Send an `event` with a fresh event id (prompt and/or controls). */
  sendEvent({ prompt, controls = [] }) {
    if (!this.state.sessionId || this.closing) return null;
    const eventId = this.nextEventId++;
    const msg = { type: "event", event_id: eventId, controls };
    if (prompt !== undefined) msg.prompt = prompt;
    this.sentAt.set(eventId, performance.now());
    this.state.lastEventId = eventId;
    this.send(msg);
    return eventId;
  }

  // ------------------------------------------------------------------ socket
  #open(createOptions) {
    this.retry.cancel(); // this is the retry (or a click came first)
    this.state.closeCode = null;
    this.state.retryStopped = null;
    this.socketError = null;
    // The reconnect button stays until a socket opens: no flicker while retries fail.
    this.#setStatus("connecting");
    const ws = connect(PATH, createOptions.session_id);
    this.socketSessionId = createOptions.session_id;
    ws.binaryType = "arraybuffer";
    // The old socket's session (if any) ends with it: the server closes it on disconnect.
    this.state.sessionId = null;
    this.closing = false;
    this.#renderButtons(); // no session on the new socket yet: reset and close are off now, not at the next HUD tick
    this.pendingCreate = null;
    this.creating = false;
    this.player.stop();
    this.player.clear();
    // A socket still connecting (a second click) is dropped; its handlers see it is stale.
    const old = this.ws;
    this.ws = ws;
    old?.close();
    ws.onopen = () => {
      if (ws !== this.ws) return;
      this.state.connected = true;
      this.el.reconnect.hidden = true;
      this.#create(createOptions);
    };
    ws.onmessage = (e) => {
      if (ws !== this.ws) return;
      if (typeof e.data === "string") this.#message(JSON.parse(e.data));
      else this.#binary(e.data);
    };
    ws.onclose = (e) => {
      if (ws !== this.ws) return;
      this.#dropped(e.code, e.reason);
    };
  }

  /** The close button while the page reconnects: no retry waits, and a socket still
   *  connecting is dropped before it can create a session. */
  #stopReconnecting() {
    this.retry.cancel();
    if (this.ws && this.ws.readyState === WebSocket.CONNECTING) {
      const ws = this.ws;
      this.ws = null; // its onclose sees it is stale
      ws.close();
    }
    this.el.reconnect.hidden = false;
    this.#setStatus("disconnected");
  }

  #dropped(code, reason) {
    this.state.connected = false;
    this.closing = false;
    this.pendingCreate = null;
    this.creating = false;
    this.state.sessionId = null;
    this.state.closeCode = code;
    this.assembling = null;
    this.player.stop();
    this.player.clear();
    this.player.useDecoder(null); // an h264 decoder's state ends with its session
    this.#fail({ code: "connection", message: `connection lost (close code ${code}${reason ? `: ${reason}` : ""})` });
    // The button stays: during the wait it reconnects at once.
    this.el.reconnect.hidden = false;
    const why = noRetryReason(code, this.socketError);
    if (this.wanted && !why) {
      this.retry.schedule();
    } else {
      this.state.retryStopped = why;
      this.#setStatus(why ? `disconnected: ${why}` : "disconnected");
    }
    this.#renderButtons();
  }

  #binary(data) {
    const chunk = this.assembling;
    if (!chunk) {
      this.#fail({ code: "protocol", message: "a binary frame arrived outside a chunk" });
      return;
    }
    chunk.payloads.push(data);
    this.received.add(data.byteLength);
    if (chunk.payloads.length === chunk.header.frames) {
      this.assembling = null;
      this.player.push(chunk.header, chunk.payloads);
    }
  }

  #message(msg) {
    switch (msg.type) {
      case "session.created":
        return this.#created(msg);
      case "event.accepted":
        return undefined;
      case "chunk":
        return this.#chunk(msg);
      case "session.reset":
        return this.#reset(msg);
      case "session.closed":
        return this.#closed(msg);
      case "error":
        return this.#fail(msg);
      default:
        return this.#fail({ code: "protocol", message: `unknown server message ${msg.type}` });
    }
  }

  #created(msg) {
    this.creating = false;
    this.retry.succeeded();
    const s = this.state;
    Object.assign(s, {
      sessionId: msg.session_id,
      model: msg.model,
      format: msg.format,
      codec: msg.codec ?? null,
      height: msg.height,
      width: msg.width,
      chunkIndex: -1,
      receivedChunkIndex: -1,
      appliedEventIds: [],
      sinceReset: [],
      serverCredits: msg.credits,
      lastError: null,
    });
    showError(this.el.error, "");
    if (this.pendingCreate) {
      // Another create was asked for while this one was on its way: that one wins.
      this.closeSession();
      return;
    }
    this.player.clear();
    this.credits.reset();
    this.#useDecoder(msg);
    this.player.configure(msg);
    this.player.start();
    this.#setStatus(`session ${msg.session_id} on ${msg.model}`);
    this.#renderButtons();
    this.#resendHeld();
  }

  #chunk(header) {
    const s = this.state;
    s.receivedChunkIndex = header.chunk_index;
    s.tickMs = header.tick_ms;
    s.serverCredits -= 1;
    const now = performance.now();
    for (const id of header.applied_event_ids) {
      const sent = this.sentAt.get(id);
      if (sent !== undefined) {
        s.rttMs = now - sent;
        this.sentAt.delete(id);
      }
    }
    if (header.frames === 0) this.player.push(header, []);
    else this.assembling = { header, payloads: [] };
  }

  #drawn(header) {
    const s = this.state;
    if (header.session_id !== s.sessionId) return; // drawn after its session ended
    s.chunkIndex = header.chunk_index;
    s.chunksDrawn += 1;
    s.framesDrawn = this.player.framesDrawn;
    if (header.applied_event_ids.length) s.appliedEventIds = header.applied_event_ids;
    if (s.sinceReset.length < SINCE_RESET_KEEP) s.sinceReset.push(header.chunk_index);
    this.#credit(this.credits.drawn(this.#queued(), s.serverCredits));
  }

  /** Chunks received (or arriving) and not yet drawn. */
  #queued() {
    return this.player.queue.length + (this.assembling ? 1 : 0);
  }

  #topUp() {
    this.#credit(this.credits.topUp(this.#queued(), this.state.serverCredits));
  }

  #credit(chunks) {
    if (this.closing || !this.state.sessionId) return;
    while (chunks > 0) {
      const n = Math.min(chunks, 64);
      if (!this.send({ type: "credit", chunks: n })) return;
      this.state.serverCredits += n;
      chunks -= n;
    }
  }

  #reset(msg) {
    const s = this.state;
    // Chunks still queued were made before the reset: drop them, return their credits.
    this.player.clear();
    this.#topUp();
    Object.assign(s, { chunkIndex: -1, receivedChunkIndex: -1, appliedEventIds: [], sinceReset: [], lastError: null });
    s.resets += 1;
    showError(this.el.error, "");
    this.#setStatus(`session ${msg.session_id} reset` +
      (msg.dropped_event_ids.length ? ` (dropped events ${msg.dropped_event_ids.join(", ")})` : ""));
    // A reset forgets the held set; the person is still holding the keys.
    this.#resendHeld();
  }

  #closed(msg) {
    this.state.sessionId = null;
    this.closing = false;
    this.player.stop();
    this.player.clear();
    this.player.useDecoder(null); // an h264 decoder's state ends with its session
    this.#setStatus(`session ${msg.session_id} closed`);
    this.#renderButtons();
    const next = this.pendingCreate;
    this.pendingCreate = null;
    if (next) this.#create(next);
  }

  #fail(msg) {
    if (msg.type === "error") this.socketError = msg.code;
    // A close whose cleanup failed may be retried.
    if (this.closing && msg.code === "internal") this.closing = false;
    this.state.lastError = msg;
    this.state.errors.push(msg);
    showError(this.el.error, describeError(msg));
    if (msg.type === "error" && this.creating && !this.state.sessionId) {
      // With no session, the server can refuse nothing but the create in flight: send the next one.
      this.creating = false;
      const next = this.pendingCreate;
      this.pendingCreate = null;
      if (next) this.#create(next);
    }
    // A server without an H.264 encoder: jpeg instead (unless a newer create is on its way).
    if (msg.code === "format_unavailable" && !this.state.sessionId && !this.creating) this.#fallBack(describeError(msg));
    if (msg.code === "session_failed" || msg.code === "session_evicted") this.#setStatus("failed: reset or close");
    // A refused session.create leaves the socket without a session.
    if (msg.code === "session_exists" && !this.state.sessionId) this.#setStatus("no session");
  }

  // ------------------------------------------------------------------ format
  /** h264 cannot be shown (`why`): a new session, in jpeg. */
  #fallBack(why) {
    this.format.fallBack(why);
    this.newSession();
  }

  #useDecoder(created) {
    const live = () => this.state.sessionId === created.session_id && !this.closing;
    const decoder = this.format.decoderFor(
      created,
      () => live() && this.send({ type: "keyframe" }),
      (why) => live() && this.#fallBack(why),
    );
    this.state.formatFallback = this.format.fallback;
    this.state.video = decoder?.stats ?? null;
    this.player.useDecoder(decoder);
  }

  // ------------------------------------------------------------------ keys
  #heldChanged(held) {
    this.state.held = held;
    this.el.held.textContent = held.length ? held.join(" ").toUpperCase() : "–";
    this.sendEvent({ controls: [keysState(held)] });
  }

  #resendHeld() {
    if (this.state.held.length) this.sendEvent({ controls: [keysState(this.state.held)] });
  }

  // ------------------------------------------------------------------ view
  #setStatus(text) {
    this.el.status.textContent = text;
  }

  #renderButtons() {
    const live = this.state.sessionId !== null && !this.closing;
    this.el.reset.disabled = !live;
    const reconnecting = this.retry.pending || (this.wanted && this.ws?.readyState === WebSocket.CONNECTING);
    this.el.close.disabled = !live && !reconnecting;
    this.el.promptForm.querySelector("button").disabled = !live;
  }

  /** The prompt box says when the selected model ignores prompts (its `uses_prompts`).
   *  It stays usable: the server still takes (and checks) a prompt such a model ignores. */
  #renderPrompt() {
    const model = this.models.find((m) => m.name === this.el.model.value);
    this.state.usesPrompts = model?.uses_prompts !== false;
    this.el.prompt.placeholder = this.state.usesPrompts
      ? "prompt, e.g. a foggy harbour at dawn"
      : `${model.name} ignores prompts: steer it with the keys`;
    this.el.prompt.title = this.state.usesPrompts ? "" : `${model.name} ignores prompts: they are accepted and have no effect`;
    this.el.imageRow.hidden = !model?.takes_image;
    this.el.trajectoryForm.hidden = !(model?.control_schemas || []).includes(TRAJECTORY_SCHEMA);
    this.look.use((model?.control_schemas || []).includes(MOUSE_SCHEMA), model?.fps);
  }

  #renderHud() {
    const s = this.state;
    s.fps = this.player.fps;
    s.creditWindow = this.credits.size;
    this.el.fps.textContent = s.sessionId ? s.fps.toFixed(0) : "–";
    this.el.tick.textContent = s.tickMs === null ? "–" : `${s.tickMs.toFixed(1)} ms`;
    this.el.rtt.textContent = s.rttMs === null ? "–" : `${s.rttMs.toFixed(0)} ms`;
    this.el.chunk.textContent = s.chunkIndex < 0 ? "–" : String(s.chunkIndex);
    this.el.applied.textContent = s.appliedEventIds.length ? s.appliedEventIds.join(", ") : "–";
    this.el.queue.textContent = `${this.#queued()} / ${s.serverCredits} (window ${this.credits.size})`;
    s.bytesPerS = this.received.perSecond();
    s.decodeMs = this.player.decodeMs;
    this.el.video.textContent = s.sessionId ? videoLine(s) : "–";
    this.el.video.title = s.formatFallback ? `jpeg instead of h264: ${s.formatFallback}` : "";
    this.#renderButtons();
  }

  #fillModels() {
    for (const m of this.models) {
      const option = new Option(m.available ? m.name : `${m.name} (unavailable)`, m.name);
      option.disabled = !m.available;
      if (!m.available) option.title = m.reason || "";
      this.el.model.append(option);
    }
    const first = this.models.find((m) => m.available);
    if (first) this.el.model.value = first.name;
    this.#renderPrompt();
  }
}

/** A keys.v1 `state` control holding exactly `held`. */
export function keysState(held) {
  return { track: "keys", schema: "keys.v1", data: { mode: "state", held } };
}

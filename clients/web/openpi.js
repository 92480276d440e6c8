// An OpenPI robot client in the browser: the page's side of WS /v1/realtime/robot/openpi.
//
// The same exchange as openpi-client's WebsocketClientPolicy (docs/protocols_openpi.md):
// after the upgrade the server sends ONE binary frame, the msgpack metadata; then
// strictly one request at a time, `pack(obs)` out and one frame back. A binary reply
// is the answer ({actions, policy_timing, server_timing}); a text reply is the server's
// error (the real client raises it), after which the server closes the socket.

import { pack, unpack } from "./msgpack.js";
import { connect } from "./net.js";

export const PATH = "/v1/realtime/robot/openpi";
// A reply slower than this ends the episode: the server's own limits (idle timeout,
// engine failure) answer well before it, so reaching it means the socket is stuck.
export const REPLY_TIMEOUT_MS = 120_000;

export class OpenPIError extends Error {}

export class OpenPIClient {
  /** Connect and read the metadata; resolves to a client with `metadata` set. */
  static connect(routeId) {
    return new Promise((resolve, reject) => {
      const client = new OpenPIClient(connect(PATH, routeId));
      client.waiter = { resolve: (meta) => { client.metadata = meta; resolve(client); }, reject };
    });
  }

  constructor(ws) {
    this.ws = ws;
    this.ws.binaryType = "arraybuffer";
    this.metadata = null;
    this.waiter = null; // {resolve, reject} of the one frame expected next
    this.closed = null; // why the socket ended (then every call fails with it)
    this.calls = 0;
    ws.onmessage = (e) => this.#frame(e.data);
    ws.onclose = (e) => this.#ended(new OpenPIError(
      `policy connection closed (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`));
    ws.onerror = () => {}; // onclose follows with the code
  }

  /** One observation -> the reply ({actions: NdArray, ...}). One call at a time. */
  infer(observation) {
    if (this.closed) return Promise.reject(this.closed);
    if (this.waiter) return Promise.reject(new OpenPIError("a policy call is already in flight"));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => this.#ended(new OpenPIError(
        `no policy reply in ${REPLY_TIMEOUT_MS / 1000} s`)), REPLY_TIMEOUT_MS);
      this.waiter = {
        resolve: (v) => { clearTimeout(timer); resolve(v); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      };
      this.calls += 1;
      this.ws.send(pack(observation));
    });
  }

  close() {
    this.#ended(new OpenPIError("policy connection closed by the page"));
  }

  #frame(data) {
    const waiter = this.waiter;
    this.waiter = null;
    if (!waiter) {
      this.#ended(new OpenPIError("the policy server sent a frame nobody asked for"));
      return;
    }
    if (typeof data === "string") {
      waiter.reject(new OpenPIError(data));
      return;
    }
    try {
      waiter.resolve(unpack(data));
    } catch (err) {
      waiter.reject(new OpenPIError(`bad reply from the policy server: ${err.message}`));
    }
  }

  #ended(error) {
    if (!this.closed) this.closed = error;
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.reject(this.closed);
    if (this.ws.readyState <= WebSocket.OPEN) this.ws.close();
  }
}

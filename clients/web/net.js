// HTTP and WebSocket addresses of the server that served this page.

import { openSocket, withKey } from "./api_key.js";

/** The URL query key a proxy routes on (protocols/routing.py, deploy/nginx). */
export const SESSION_ID_PARAM = "session_id";

/**
 * `ws://host/path?session_id=...` (or `wss://` behind TLS) on the page's own host. The
 * session id in the query lets a proxy in front of several replicas send every
 * connection of a session to the same one; the server ignores it.
 */
export function wsUrl(path, sessionId) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const query = sessionId ? `?${SESSION_ID_PARAM}=${encodeURIComponent(sessionId)}` : "";
  return `${proto}//${location.host}${path}${query}`;
}

/** A WebSocket to `path` on this server (wsUrl), offering the API key if the tab holds one. */
export function connect(path, sessionId) {
  return openSocket(wsUrl(path, sessionId));
}

/** The server refused the request for want of a valid API key (HTTP 401). */
export class Unauthorized extends Error {
  constructor(message) {
    super(message);
    this.name = "Unauthorized";
  }
}

/** The model list of `GET /v1/models`: [{name, kind, available, reason?, ...}]. */
export async function fetchModels() {
  const res = await fetch("/v1/models", withKey());
  if (res.status === 401) {
    const body = await res.json().catch(() => null);
    throw new Unauthorized(body?.error?.message || "GET /v1/models answered 401");
  }
  if (!res.ok) throw new Error(`GET /v1/models answered ${res.status}`);
  const body = await res.json();
  return body.data;
}

/** A model's load as a line: "loading lingbot: reading checkpoint, 12.3 of 74.0 GB …". */
export function loadingLine(m) {
  const gb = (n) => (n / 1e9).toFixed(1);
  const bytes = m.done_bytes == null ? "" : `, ${gb(m.done_bytes)}${m.total_bytes ? ` of ${gb(m.total_bytes)}` : ""} GB`;
  return `loading ${m.name}: ${m.stage}${bytes} …`;
}

/**
 * The model list once the server has loaded its models. While it loads (entries with
 * `state: "loading"`, sessions refused with `loading`) it asks again every `everyMs`,
 * calling `progress(entry)` with the model being built (else the first still waiting).
 */
export async function fetchModelsWhenLoaded(progress, everyMs = 500) {
  for (;;) {
    const models = await fetchModels();
    const loading = models.filter((m) => m.state === "loading");
    if (!loading.length) return models;
    progress(loading.find((m) => m.seconds > 0 && !m.stage.startsWith("built")) || loading[0]);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** `GET /healthz`: {ok, text}. A 503 carries the engine's reason. */
export async function fetchHealth() {
  const res = await fetch("/healthz");
  return { ok: res.ok, text: (await res.text()).trim() };
}

/** A short random id suffix (not secret; only has to be unlikely to collide). */
export function randomId(prefix) {
  const n = Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, "0");
  return `${prefix}-${n}`;
}

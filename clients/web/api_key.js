// The server's API key, when it has keys (realtime/server/auth.py, docs/protocols.md
// "Authentication"): kept for this tab, sent on every request the page makes.
//
// Fetches carry it as `Authorization: Bearer KEY`. A browser's WebSocket cannot set
// headers, so sockets offer it as a subprotocol beside `realtime`:
// `new WebSocket(url, ["realtime", "realtime.api-key.KEY"])`; the server answers
// `realtime`. Without a key nothing is offered, exactly as before keys existed: a server
// that answered no subprotocol to an offered one would fail the handshake in the browser.
//
// A key may also come in the page's fragment (`/#api_key=KEY`): browsers never send the
// fragment, so it reaches neither the server nor a proxy's log; it is taken from the
// address bar at once so it is not bookmarked, shared or kept in history.

export const SUBPROTOCOL = "realtime";
export const KEY_SUBPROTOCOL_PREFIX = "realtime.api-key.";
export const FRAGMENT_PARAM = "api_key";
// sessionStorage, not localStorage: the key ends with the tab (closing it forgets the
// key), is never shared with other tabs, and does not sit on disk for anyone who later
// uses this browser profile. A reload of the same tab keeps it.
const STORAGE_KEY = "realtime.api_key";

// RFC 6455 section 4.1: a subprotocol is an RFC 7230 `token`, 1*tchar:
// tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA.
// Chromium throws a SyntaxError from `new WebSocket` for anything else.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** Why `key` cannot be sent (as a subprotocol token), or null when it can. */
export function keyProblem(key) {
  if (!key) return "the key is empty";
  if (!TOKEN.test(key)) {
    return "this key cannot be sent from a browser: a WebSocket subprotocol (RFC 6455) may hold only " +
      "letters, digits and ! # $ % & ' * + - . ^ _ ` | ~ (no spaces, quotes, commas, slashes, = : ; or " +
      "non-ASCII); use a key made of those, or a client that sends the Authorization header";
  }
  return null;
}

/** The key this tab holds, or null. */
export function apiKey() {
  try {
    return sessionStorage.getItem(STORAGE_KEY);
  } catch {
    return null; // storage disabled: no key held
  }
}

/** Keep `key` for this tab; null forgets it. */
export function setApiKey(key) {
  if (key === null) sessionStorage.removeItem(STORAGE_KEY);
  else sessionStorage.setItem(STORAGE_KEY, key);
}

/**
 * Take `#api_key=KEY` out of the address bar (history.replaceState: no new history entry,
 * nothing reloaded) and return KEY (percent-decoded; a "+" stays a "+"), or null when the
 * fragment has none. Any other fragment parameters stay.
 */
export function takeKeyFromFragment() {
  const fragment = location.hash.replace(/^#/, "");
  if (!fragment) return null;
  let key = null;
  const rest = [];
  for (const part of fragment.split("&")) {
    const eq = part.indexOf("=");
    if (eq >= 0 && part.slice(0, eq) === FRAGMENT_PARAM) {
      try {
        key = decodeURIComponent(part.slice(eq + 1));
      } catch {
        key = part.slice(eq + 1); // a stray "%": the text as typed (keyProblem refuses it)
      }
    } else {
      rest.push(part);
    }
  }
  if (key === null) return null;
  const hash = rest.length ? `#${rest.join("&")}` : "";
  history.replaceState(history.state, "", `${location.pathname}${location.search}${hash}`);
  return key;
}

/** `fetch` options that carry the key (if any) on top of `init`. */
export function withKey(init = {}) {
  const key = apiKey();
  if (!key) return init;
  return { ...init, headers: { ...(init.headers || {}), Authorization: `Bearer ${key}` } };
}

/** A WebSocket to `url` offering the key (if any) as a subprotocol beside `realtime`. */
export function openSocket(url) {
  const key = apiKey();
  return key ? new WebSocket(url, [SUBPROTOCOL, KEY_SUBPROTOCOL_PREFIX + key]) : new WebSocket(url);
}

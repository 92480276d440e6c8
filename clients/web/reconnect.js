// Opening a dropped connection again by itself: which closes are worth a retry, and when.
//
// A panel whose socket drops asks `noRetryReason` first; null means it schedules a retry
// on its Reconnector, which waits, shows the countdown and opens a new connection:
//
//   attempt      0          1         2       3       4       5 ...
//   wait (s)  0.25-0.5   0.5-1     1-2     2-4     4-8    5-10 (then 5-10 every time)
//
// The wait doubles from FIRST_MS up to MAX_MS and is drawn from its upper half ("equal
// jitter"): after a restart every open page retries, and without the random half they
// would all come back at the same instants. The count starts over once a connection
// works again (the panel calls `succeeded`), not when a socket merely opens: a server
// that accepts and then refuses (1013) must not be asked twice a second.

export const FIRST_MS = 500;
export const MAX_MS = 10_000;
const COUNTDOWN_EVERY_MS = 100;

/** The wait before retry `attempt` (0 for the first), for `random` in [0, 1). */
export function backoffDelay(attempt, random = Math.random()) {
  const ceiling = Math.min(MAX_MS, FIRST_MS * 2 ** Math.min(attempt, 20));
  return Math.round(ceiling / 2 + (ceiling / 2) * random);
}

/**
 * Why a connection that closed with `closeCode` (after the server `error` code
 * `errorCode` on it, if any) is not opened again by itself; null when a retry may help.
 * Such a close leaves the panel's reconnect button to the person.
 */
export function noRetryReason(closeCode, errorCode = null) {
  // A server with no voice (tts_unavailable) closes with 1011 like a passing failure
  // would; only installing the voice helps, so the error says more than the code.
  if (errorCode === "tts_unavailable") return "the server has no voice";
  switch (closeCode) {
    // closed_by_admin: an operator ended the session on purpose; opening a new one by
    // itself would undo that.
    case 1008:
      return "closed by the server's operator (1008)";
    // idle_timeout: the server frees sessions nobody uses; a tab left open would
    // otherwise hold one for ever, a new one every 5 minutes.
    case 4408:
      return "closed after idling (4408)";
    // The server refused what the page sent (a frame too large, not UTF-8, binary where
    // text belongs, a protocol error): the page would send the same again.
    case 1002:
    case 1003:
    case 1007:
    case 1009:
      return `the server refused what the page sent (${closeCode})`;
    // Everything else is retried: 1001 (the server drains for a restart), 1006 (no close
    // frame: the process died, or nothing listens yet), 1011 (a server failure, which a
    // restart may end), 1012 (service restart), 1013 (try again later: too many sessions
    // from this address, until one of them closes; the backoff keeps the asks rare).
    default:
      return null;
  }
}

export class Reconnector {
  /**
   * @param {() => void} open    opens a new connection (and calls `cancel` itself, as
   *                             a manual reconnect does)
   * @param {(text: string) => void} show  puts the countdown on the panel's status line
   */
  constructor(open, show) {
    this.open = open;
    this.show = show;
    this.attempt = 0; // retries since the connection last worked
    this.timer = null;
    this.ticker = null;
    this.dueAt = 0; // performance.now() of the scheduled retry
  }

  /** A retry is scheduled and has not started yet. */
  get pending() {
    return this.timer !== null;
  }

  /** Open again after the next wait of the backoff. */
  schedule() {
    this.cancel();
    const wait = backoffDelay(this.attempt);
    this.attempt += 1;
    this.dueAt = performance.now() + wait;
    this.timer = setTimeout(() => {
      this.cancel();
      this.open();
    }, wait);
    this.ticker = setInterval(() => this.#countdown(), COUNTDOWN_EVERY_MS);
    this.#countdown();
  }

  /** The connection works again: the next drop starts from the first wait. */
  succeeded() {
    this.attempt = 0;
  }

  /** Drop the scheduled retry, if any; true if there was one. */
  cancel() {
    const had = this.pending;
    clearTimeout(this.timer);
    clearInterval(this.ticker);
    this.timer = null;
    this.ticker = null;
    return had;
  }

  #countdown() {
    const left = Math.max(0, this.dueAt - performance.now()) / 1000;
    this.show(`reconnecting in ${left.toFixed(1)} s…`);
  }
}

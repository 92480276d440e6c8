// How many chunks the world server may run ahead of the drawing (the credit window).
//
// Credits bound memory: the server makes a chunk only while it holds a credit, and
// the page hands one back only after drawing (or dropping) a chunk, so a slow tab
// never floods. The window also sets the latency of a key press: a chunk waits
// behind everything already queued, so a full window of 4 at 15 fps shows a key
// press about 4/15 s late. The window therefore adapts, between MIN and MAX:
//
//   a frame was due and none was ready (stall)          -> size + 1 (more buffer)
//   SHRINK_AFTER draws in a row left >= 2 chunks queued  -> size - 1 (less latency)
//
// A fast server then settles at 2 (one chunk drawn, one ready); a server that
// only just keeps up with the frame rate stays at 4.

export const INITIAL = 4;
export const MIN = 2;
export const MAX = 4;
export const SHRINK_AFTER = 30; // 2 s at 15 fps

export class CreditWindow {
  constructor() {
    this.size = INITIAL;
    this.deepDraws = 0;
  }

  /** A chunk was drawn and `queued` chunks are left; returns credits to send now. */
  drawn(queued, held) {
    this.deepDraws = queued >= 2 ? this.deepDraws + 1 : 0;
    if (this.deepDraws >= SHRINK_AFTER && this.size > MIN) {
      this.size -= 1;
      this.deepDraws = 0;
    }
    return this.topUp(queued, held);
  }

  /** A frame was due and none was ready. */
  stalled() {
    this.deepDraws = 0;
    if (this.size < MAX) this.size += 1;
  }

  /** Credits that bring queued + held (by the server) up to the window size. */
  topUp(queued, held) {
    return Math.max(0, this.size - queued - held);
  }

  reset() {
    this.size = INITIAL;
    this.deepDraws = 0;
  }
}

// Amounts over a sliding window of time: bytes per second received, the mean of recent
// decode times. Each sample is kept until it is older than the window.

export class RateMeter {
  constructor(windowMs = 1000) {
    this.windowMs = windowMs;
    this.samples = []; // [performance.now(), value]
  }

  add(value, now = performance.now()) {
    this.samples.push([now, value]);
    this.#expire(now);
  }

  /** The sum of the window's values, per second of window. */
  perSecond(now = performance.now()) {
    this.#expire(now);
    return this.samples.reduce((sum, [, v]) => sum + v, 0) * (1000 / this.windowMs);
  }

  /** The mean of the window's values; null when it is empty. */
  mean(now = performance.now()) {
    this.#expire(now);
    if (!this.samples.length) return null;
    return this.samples.reduce((sum, [, v]) => sum + v, 0) / this.samples.length;
  }

  clear() {
    this.samples = [];
  }

  #expire(now) {
    while (this.samples.length && now - this.samples[0][0] > this.windowMs) this.samples.shift();
  }
}

// Paced drawing of world frames, and the credit that each drawn chunk gives back.
//
//   socket ─ chunk k + N frames ─▶ decode ─▶ queue ─▶ draw one frame per 1/fps
//                                                                          │
//                               credit {chunks: 1} ◀── last frame of k drawn
//
// The server runs ahead by at most the credits it holds. The page hands one back
// only once it has *drawn* a chunk, so a slow or hidden tab (requestAnimationFrame
// throttled or stopped) stops the server instead of piling frames up in memory.
//
// Decoding is the decoder's: ImageFrames (jpeg/png through createImageBitmap, rgb8 raw)
// unless the session set another (h264_decoder.js). A decoder's `decode(header, payloads)`
// resolves with drawable frames that have `close()` (ImageBitmap, VideoFrame), as many as
// it could decode: a chunk with fewer frames is drawn shorter, never waited on.

import { RateMeter } from "./rate_meter.js";

const FPS_WINDOW_MS = 1000;

export class FramePlayer {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {(header: object) => void} onChunkDrawn after the last frame of a chunk is drawn
   *   (also for a chunk that failed to decode, so its credit still comes back)
   * @param {(message: string) => void} onError
   * @param {() => void} onStall a frame was due and none was ready (once per gap)
   */
  constructor(canvas, onChunkDrawn, onError, onStall = () => {}) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.onChunkDrawn = onChunkDrawn;
    this.onError = onError;
    this.onStall = onStall;
    this.primed = false; // a frame was drawn since the last clear: gaps count as stalls
    this.starved = false; // in a gap already reported
    this.queue = [];
    this.interval = 1000 / 15;
    this.nextDue = 0;
    this.running = false;
    this.drawTimes = [];
    this.framesDrawn = 0;
    this.decoder = new ImageFrames();
  }

  /** Decode the next chunks with `decoder` (null: ImageFrames); closes the one before. */
  useDecoder(decoder) {
    this.decoder.close();
    this.decoder = decoder || new ImageFrames();
  }

  /** Mean decode time (ms) of a frame over the last second; null when none was decoded. */
  get decodeMs() {
    return this.decoder.decodeMs;
  }

  /** Size the canvas to the model's frames (CSS scales it up, pixelated) and set the pace. */
  configure({ width, height, fps }) {
    this.canvas.width = width;
    this.canvas.height = height;
    this.interval = 1000 / (fps > 0 ? fps : 15);
  }

  start() {
    if (this.running) return;
    this.running = true;
    requestAnimationFrame(this.#tick);
  }

  stop() {
    this.running = false;
  }

  /** Queue one chunk: its header and its N encoded frames (ArrayBuffers). */
  push(header, payloads) {
    const entry = { header, frames: null, failed: false, next: 0, dropped: false };
    this.queue.push(entry);
    this.decoder.decode(header, payloads)
      .then((frames) => {
        if (entry.dropped) frames.forEach((f) => f.close());
        else entry.frames = frames;
      })
      .catch((err) => {
        entry.failed = true;
        this.onError(`chunk ${header.chunk_index}: cannot decode ${header.format} frame: ${err}`);
      });
  }

  /** Drop every queued chunk (after a reset); returns how many were dropped. */
  clear() {
    const dropped = this.queue.length;
    for (const entry of this.queue) {
      entry.dropped = true;
      entry.frames?.slice(entry.next).forEach((f) => f.close());
    }
    this.queue = [];
    this.primed = false;
    return dropped;
  }

  /** Frames drawn in the last second. */
  get fps() {
    const now = performance.now();
    while (this.drawTimes.length && now - this.drawTimes[0] > FPS_WINDOW_MS) this.drawTimes.shift();
    return this.drawTimes.length * (1000 / FPS_WINDOW_MS);
  }

  #tick = (now) => {
    if (!this.running) return;
    requestAnimationFrame(this.#tick);
    // rAF timestamps jitter by a millisecond or two: allow that much early.
    if (now < this.nextDue - 2) return;
    const head = this.queue[0];
    if (!head || (!head.frames && !head.failed)) {
      if (this.primed && !this.starved && now > this.nextDue + this.interval / 2) {
        this.starved = true;
        this.onStall();
      }
      return;
    }
    this.starved = false;
    // After a stall (no frame was ready) start the pace again from now rather
    // than bursting to catch up.
    this.nextDue = now - this.nextDue > this.interval ? now + this.interval : this.nextDue + this.interval;
    if (head.frames && head.next < head.frames.length) {
      const frame = head.frames[head.next++];
      this.ctx.drawImage(frame, 0, 0);
      frame.close();
      this.framesDrawn += 1;
      this.drawTimes.push(now);
      this.primed = true;
      if (head.next < head.frames.length) return;
    }
    this.queue.shift();
    this.onChunkDrawn(head.header);
  };
}

/** jpeg, png and rgb8 frames, each decoded on its own. */
export class ImageFrames {
  constructor() {
    this.decodeTimes = new RateMeter();
  }

  decode(header, payloads) {
    const started = performance.now();
    return Promise.all(payloads.map((p) => decodeFrame(p, header))).then((frames) => {
      if (frames.length) this.decodeTimes.add((performance.now() - started) / frames.length);
      return frames;
    });
  }

  get decodeMs() {
    return this.decodeTimes.mean();
  }

  close() {}
}

/** One encoded frame -> ImageBitmap (jpeg/png via the browser's decoder; rgb8 raw). */
async function decodeFrame(payload, header) {
  if (header.format === "rgb8") {
    const rgb = new Uint8Array(payload);
    const rgba = new Uint8ClampedArray(header.width * header.height * 4);
    for (let i = 0, j = 0; i < rgb.length; i += 3, j += 4) {
      rgba[j] = rgb[i];
      rgba[j + 1] = rgb[i + 1];
      rgba[j + 2] = rgb[i + 2];
      rgba[j + 3] = 255;
    }
    return createImageBitmap(new ImageData(rgba, header.width, header.height));
  }
  return createImageBitmap(new Blob([payload], { type: `image/${header.format}` }));
}

// Mouse look for models that take mouse.v1 (their `control_schemas` in GET /v1/models):
// a click on the canvas captures the pointer (Pointer Lock); while it is captured, the
// pointer's motion is summed and sent once a frame interval as one mouse.v1 [yaw, pitch]
// delta (right and up positive), scaled from pixels and clamped to the schema's bound.
// Escape (the browser's own) releases it.

/** mouse.v1 units per pixel of pointer motion: 20 px of motion in a frame is one look key's 0.1. */
export const UNITS_PER_PIXEL = 0.005;
/** protocols/mouse_v1.py MAX_DELTA */
export const MAX_DELTA = 1.0;
export const MOUSE_SCHEMA = "mouse.v1";

const clamp = (x) => Math.max(-MAX_DELTA, Math.min(MAX_DELTA, x));

export class PointerLook {
  /** `send(control)` sends one event with the control; `intervalMs`: one frame of the model. */
  constructor(canvas, send) {
    this.canvas = canvas;
    this.send = send;
    this.enabled = false; // the selected model takes mouse.v1
    this.dx = 0;
    this.dy = 0;
    this.timer = null;
    this.state = { locked: false, sent: 0, last: null }; // read by the tests (window.demo.world.state.mouse)
    canvas.addEventListener("click", () => {
      if (this.enabled && document.pointerLockElement !== canvas) canvas.requestPointerLock?.();
    });
    document.addEventListener("pointerlockchange", () => {
      this.state.locked = document.pointerLockElement === canvas;
      if (!this.state.locked) this.#flush();
    });
    document.addEventListener("mousemove", (e) => {
      if (!this.state.locked) return;
      this.dx += e.movementX;
      this.dy += e.movementY;
    });
  }

  /** Turn mouse look on for a model that takes mouse.v1 (off releases the pointer). */
  use(enabled, fps) {
    this.enabled = enabled;
    clearInterval(this.timer);
    this.timer = null;
    this.dx = this.dy = 0;
    this.canvas.title = enabled ? "click to look around with the mouse (Esc releases it)" : "";
    if (!enabled) {
      if (document.pointerLockElement === this.canvas) document.exitPointerLock();
      return;
    }
    this.timer = setInterval(() => this.#flush(), 1000 / (fps || 25));
  }

  #flush() {
    if (!this.dx && !this.dy) return;
    const delta = [clamp(this.dx * UNITS_PER_PIXEL), clamp(-this.dy * UNITS_PER_PIXEL)];
    this.dx = this.dy = 0;
    if (!this.enabled) return;
    this.state.sent += 1;
    this.state.last = delta;
    this.send({ track: "mouse", schema: MOUSE_SCHEMA, data: { deltas: [delta] } });
  }
}

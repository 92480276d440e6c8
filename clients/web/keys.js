// The held-key set of keys.v1, from the keyboard and the on-screen buttons.
//
// keys.v1 `state` events carry the whole held set, so the page only has to say
// when the set changes: a key going down or up. Auto-repeat keydowns are not
// changes and are dropped; so are keydowns aimed at a text box (typing "w" in
// the prompt must not walk). A keyup always counts, wherever focus went, so a
// key can never stay stuck down; losing window focus releases everything.

import { isTextTarget } from "./dom.js";

/** keys.v1 key names, in the model's action-bit order. */
export const KEYS = ["w", "a", "s", "d", "i", "j", "k", "l"];

// Physical key positions (KeyboardEvent.code), so WASD works on any layout.
const CODE_TO_KEY = Object.fromEntries(KEYS.map((k) => [`Key${k.toUpperCase()}`, k]));

export class HeldKeys {
  /** @param {(held: string[]) => void} onChange called with the new held set, in KEYS order. */
  constructor(onChange) {
    this.onChange = onChange;
    this.keyboard = new Set();
    this.pointer = new Set();
    this.last = "";
  }

  /** The held keys, in KEYS order. */
  held() {
    return KEYS.filter((k) => this.keyboard.has(k) || this.pointer.has(k));
  }

  /** Listen on the window and wire the on-screen `[data-key]` buttons under `pad`. */
  attach(pad) {
    window.addEventListener("keydown", (e) => this.#keyboard(e, true));
    window.addEventListener("keyup", (e) => this.#keyboard(e, false));
    window.addEventListener("blur", () => this.releaseAll());
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) this.releaseAll();
    });
    for (const button of pad.querySelectorAll("[data-key]")) {
      const key = button.dataset.key;
      const up = () => this.#set(this.pointer, key, false);
      button.addEventListener("pointerdown", (e) => {
        button.setPointerCapture?.(e.pointerId);
        this.#set(this.pointer, key, true);
      });
      button.addEventListener("pointerup", up);
      button.addEventListener("pointercancel", up);
      button.addEventListener("lostpointercapture", up);
    }
    this.pad = pad;
  }

  releaseAll() {
    this.keyboard.clear();
    this.pointer.clear();
    this.#changed();
  }

  #keyboard(e, down) {
    const key = CODE_TO_KEY[e.code];
    if (key === undefined) return;
    if (down && (e.repeat || e.ctrlKey || e.metaKey || e.altKey || isTextTarget(e.target))) return;
    if (!down && !this.keyboard.has(key)) return;
    e.preventDefault();
    this.#set(this.keyboard, key, down);
  }

  #set(source, key, down) {
    if (down) source.add(key);
    else source.delete(key);
    this.#changed();
  }

  #changed() {
    const held = this.held();
    if (this.pad) {
      for (const b of this.pad.querySelectorAll("[data-key]")) b.classList.toggle("held", held.includes(b.dataset.key));
    }
    const signature = held.join("");
    if (signature === this.last) return;
    this.last = signature;
    this.onChange(held);
  }
}

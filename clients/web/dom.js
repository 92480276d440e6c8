// Small DOM helpers shared by the panels.

export const $ = (id) => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`missing element #${id}`);
  return el;
};

/** Show `text` in an error element (hidden when text is empty). */
export function showError(el, text) {
  el.textContent = text || "";
  el.hidden = !text;
}

/** The text a server `error` message is shown as: "code: message (event N)". */
export function describeError(msg) {
  const where = msg.event_id !== undefined ? ` (event ${msg.event_id})` : "";
  return `${msg.code}: ${msg.message}${where}`;
}

/** True when `target` takes typing, so page-wide key bindings must leave it alone. */
export function isTextTarget(target) {
  if (!(target instanceof HTMLElement)) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  return tag === "TEXTAREA" || tag === "SELECT" || (tag === "INPUT" && target.type !== "button");
}

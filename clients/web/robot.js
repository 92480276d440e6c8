// The robot panel. A policy that drives an agent through the maze does not exist
// yet, so this panel only says so; when the server lists a policy it shows that
// policy's metadata (from GET /v1/models; no OpenPI socket is opened).

import { $ } from "./dom.js";

export class RobotPanel {
  constructor(models) {
    this.policies = models.filter((m) => m.kind === "policy");
    this.state = { policies: this.policies.map((p) => p.name), placeholder: true };
  }

  start() {
    if (!this.policies.length) return;
    const box = $("robot-policies");
    $("robot-placeholder").textContent =
      "Policies served at /v1/realtime/robot/openpi (OpenPI protocol). Watching one drive an agent " +
      "in the maze comes with a maze-driving policy.";
    for (const policy of this.policies) {
      const title = document.createElement("h3");
      title.textContent = policy.available ? policy.name : `${policy.name} (unavailable)`;
      const { name, kind, available, metadata, ...rest } = policy;
      box.append(title, facts({ ...rest, ...(metadata || {}) }));
    }
    box.hidden = false;
    this.state.placeholder = false;
  }
}

/** A <dl> of `obj`'s entries, lists joined and nested objects as compact JSON. */
function facts(obj) {
  const dl = document.createElement("dl");
  dl.className = "hud facts";
  for (const [key, value] of Object.entries(obj)) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = key;
    dd.textContent = Array.isArray(value)
      ? value.join(key.endsWith("resolution") ? "×" : ", ")
      : typeof value === "object" && value !== null
        ? JSON.stringify(value)
        : String(value);
    dl.append(dt, dd);
  }
  return dl;
}

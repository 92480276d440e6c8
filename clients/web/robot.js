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
      "Policies served at /v1/realtime/robot/openpi (OpenPI protocol). Watching one drive in the maze " +
      "comes with a maze-driving policy.";
    for (const policy of this.policies) {
      const title = document.createElement("h3");
      title.textContent = policy.available ? policy.name : `${policy.name} (unavailable)`;
      const facts = document.createElement("pre");
      const { name, kind, ...rest } = policy;
      facts.textContent = JSON.stringify(rest, null, 2);
      box.append(title, facts);
    }
    box.hidden = false;
    this.state.placeholder = false;
  }
}

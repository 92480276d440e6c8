// One robot episode: the served maze policy drives a world, goal to result.
//
// The page is the robot, as models/policy/maze/robot.py is in Python: it builds each
// observation (camera, state, prompt), calls the policy over OpenPI (openpi.js), and
// executes the chunk's first `execute_horizon` rows, one world frame per row:
//
//   simulator mode   the camera is the maze-sim world (the real simulator, with goals)
//   world-model mode the camera is a generated world (maze); a maze-sim session gets
//                    the same keys in lockstep and judges the goal ("dreaming", as
//                    bench/maze/policy_dream.py re-simulates)
//
// The state is the policy's layout from its metadata: "keys" (cos / sin of the heading,
// pitch / state_pitch_scale, the keys of the last state_key_history frames, oldest first)
// or "map" (the same, then state_map_floats floats of the robot's map as seen, which
// maze-sim sends in its chunk info, models/maze/seen_map.py map_info); the heading
// and pitch come from maze-sim's chunk info too. JS's float32 cos / sin may differ from
// torch's in the last bit, so the page's episodes are the policy's, not bit-equal to the
// Python robot's. The episode ends when maze-sim says `reached`, after `budget`
// frames, on stop, or on the first error of any of its connections.

import { NdArray } from "./msgpack.js";
import { OpenPIClient } from "./openpi.js";
import { WorldLink } from "./world_link.js";
import { KEYS } from "./keys.js";

/** The noise seed of policy call `call` in the episode of maze `seed` (models/policy/maze/episodes.py). */
export function callSeed(seed, call) {
  return (BigInt(seed) * 1000003n + BigInt(call)) % (1n << 63n);
}

/** The layouts the page builds (models/policy/maze/model.py STATE_LAYOUTS). */
const LAYOUTS = ["keys", "map"];

/**
 * The maze policy's state vector, float32. `history`: the last frames' key bits, oldest
 * first; `tail` (the map layout's floats, mapFloats) follows them.
 */
export function mazeState(yaw, pitch, pitchScale, history, tail = null) {
  const head = 3 + history.length * KEYS.length;
  const out = new Float32Array(head + (tail ? tail.length : 0));
  out[0] = Math.cos(yaw);
  out[1] = Math.sin(yaw);
  out[2] = pitch / pitchScale;
  history.forEach((bits, i) => out.set(bits, 3 + i * KEYS.length));
  if (tail) out.set(tail, head);
  return out;
}

/** maze-sim's chunk info `map` ({pose, cells: base64 of bit-packed 0/1 cells}) as `n` float32s. */
export function mapFloats(map, n) {
  if (!map || !Array.isArray(map.pose) || typeof map.cells !== "string") {
    throw new Error("the simulator world sends no map (chunk info \"map\"), which this policy's state needs");
  }
  const cells = n - map.pose.length;
  const bytes = Uint8Array.from(atob(map.cells), (c) => c.charCodeAt(0));
  if (cells < 0 || bytes.length !== Math.ceil(cells / 8)) {
    throw new Error(`the simulator's map has ${map.pose.length} + ${bytes.length * 8} floats, the policy reads ${n}`);
  }
  const out = new Float32Array(n);
  out.set(map.pose);
  for (let i = 0; i < cells; i += 1) out[map.pose.length + i] = (bytes[i >> 3] >> (7 - (i & 7))) & 1;
  return out;
}

/** Why `meta` (OpenPI metadata) cannot drive the maze from its 64x64 camera, or null. */
export function mazeProblem(meta) {
  if (!meta) return "no metadata";
  if (meta.action_keys !== KEYS.join("") || meta.action_dim !== KEYS.length) {
    return `its actions are not the maze's key bits ${KEYS.join("").toUpperCase()} (action_keys ${meta.action_keys}, dim ${meta.action_dim})`;
  }
  const res = meta.image_resolution || [];
  if ((meta.image_keys || []).length !== 1 || res[0] !== 64 || res[1] !== 64) {
    return `it wants cameras ${JSON.stringify(meta.image_keys)} at ${res.join("x")}, the maze has one 64x64 camera`;
  }
  const layout = meta.state_layout ?? "keys";
  if (!LAYOUTS.includes(layout)) {
    return `its state layout is "${layout}"; the page builds the ${LAYOUTS.map((l) => `"${l}"`).join(" and ")} layouts only`;
  }
  const history = meta.state_key_history;
  const tail = layout === "map" ? meta.state_map_floats : 0;
  if (!Number.isInteger(history) || !(meta.state_pitch_scale > 0) || !Number.isInteger(tail)
      || meta.state_dim !== 3 + history * KEYS.length + tail) {
    return "its metadata does not give the maze state layout (state_key_history, state_pitch_scale, state_map_floats)";
  }
  return null;
}

export class RobotEpisode {
  /**
   * @param {object} o  {id, prompt, seed, budget, sim (world name), dream (world name or null),
   *                     view: {frame(which, chunk, frame), chunk(actions, executed, call),
   *                            executed(held keys of the frame just made), status(text), infer(ms),
   *                            map(the map layout's floats, each observation's, and how many
   *                                of them lead as the pose)}}
   */
  constructor(o) {
    Object.assign(this, o);
    this.frames = 0; // executed frames
    this.calls = 0;
    this.stopped = false;
    this.links = [];
    this.policy = null;
  }

  /** Run to the end; resolves to the result {success, frames, calls, reason, message?}. */
  async run() {
    try {
      return await this.#drive();
    } catch (err) {
      if (this.stopped) return this.#result(false, "stopped");
      return this.#result(false, "error", err.message || String(err));
    } finally {
      this.#closeAll();
    }
  }

  stop() {
    this.stopped = true;
    this.#closeAll();
  }

  async #drive() {
    this.view.status("connecting to the policy");
    this.policy = await OpenPIClient.connect(this.id);
    if (this.stopped) throw new Error("stopped");
    const meta = this.policy.metadata;
    const problem = mazeProblem(meta);
    if (problem) throw new Error(`the served policy cannot drive the maze: ${problem}`);
    const execute = meta.execute_horizon ?? meta.action_horizon;
    const history = Array.from({ length: meta.state_key_history }, () => new Float32Array(KEYS.length));
    this.view.status("starting the world");
    const sim = await this.#link(`${this.id}-sim`, { model: this.sim, seed: this.seed, prompt: this.prompt });
    const dream = this.dream ? await this.#link(`${this.id}-dream`, { model: this.dream, seed: this.seed }) : null;
    const interval = 1000 / (sim.created.fps || 15);
    let truth = await sim.next();
    let camera = dream ? await dream.next() : truth;
    let shownAt = this.#show(truth, camera, 0);
    this.view.status(`driving: ${this.prompt}`);
    for (;;) {
      const info = truth.header.info || {};
      if (info.reached) return this.#result(true, "reached");
      if (this.frames >= this.budget) return this.#result(false, "budget");
      if (info.yaw === undefined) throw new Error(`world ${this.sim} sends no pose (chunk info); is it the maze simulator?`);
      const map = meta.state_layout === "map" ? mapFloats(info.map, meta.state_map_floats) : null;
      if (map) this.view.map(map, info.map.pose.length);
      const obs = {
        [meta.image_keys[0]]: new NdArray("|u1", [64, 64, 3], camera.frame),
        [meta.state_key || "state"]: new NdArray("<f4", [meta.state_dim],
          mazeState(info.yaw, info.pitch, meta.state_pitch_scale, history, map)),
        [meta.prompt_key || "prompt"]: this.prompt,
        // Our extensions (docs/protocols_openpi.md): the episode's id names the policy
        // session (GET /v1/sessions lists it beside the world sessions <id>-sim, <id>-dream),
        // and the seed makes the call reproducible, as models/policy/maze/robot.py does.
        session_id: this.id,
        sampling_params: { seed: callSeed(this.seed, this.calls) },
      };
      const started = performance.now();
      const reply = await this.policy.infer(obs);
      this.view.infer(performance.now() - started);
      this.calls += 1;
      const actions = reply.actions;
      if (!(actions instanceof NdArray) || actions.shape.length !== 2 || actions.shape[1] !== KEYS.length) {
        throw new Error(`the policy answered actions ${JSON.stringify(actions?.shape)}, not [horizon, ${KEYS.length}]`);
      }
      const n = Math.min(execute, actions.shape[0], this.budget - this.frames);
      const rows = Array.from({ length: n }, (_, t) => actions.row(t).map((b) => (b > 0.5 ? 1 : 0)));
      this.view.chunk(actions, n, this.calls);
      const held = rows.map((bits) => KEYS.filter((_, k) => bits[k]));
      sim.play(held);
      dream?.play(held);
      for (const [t, bits] of rows.entries()) {
        truth = await sim.next();
        camera = dream ? await dream.next() : truth;
        this.frames += 1;
        this.view.executed(held[t]);
        history.shift();
        history.push(Float32Array.from(bits));
        await this.#paced(shownAt, interval);
        shownAt = this.#show(truth, camera, this.frames);
        // Reached within the chunk: the episode ends at that frame (episodes.py's rule).
        if (truth.header.info?.reached) break;
      }
    }
  }

  async #link(sessionId, options) {
    const link = await WorldLink.open(sessionId, options);
    this.links.push(link);
    if (this.stopped) throw new Error("stopped");
    return link;
  }

  #show(truth, camera, frame) {
    this.view.frame("camera", camera, frame);
    if (this.dream) this.view.frame("truth", truth, frame);
    return performance.now();
  }

  /** Wait until one frame interval after the last frame shown (the world's fps). */
  async #paced(shownAt, interval) {
    const wait = shownAt + interval - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    if (this.stopped) throw new Error("stopped");
  }

  #result(success, reason, message) {
    const out = { success, reason, frames: this.frames, calls: this.calls, prompt: this.prompt, seed: this.seed,
                  world: this.dream || this.sim };
    if (message) out.message = message;
    return out;
  }

  #closeAll() {
    for (const link of this.links) link.close();
    this.links = [];
    this.policy?.close();
  }
}

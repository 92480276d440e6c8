// The robot panel: pick a goal and a maze, watch the served policy drive, chunks drawn.
//
// The served policy (the first in GET /v1/models, the one at /v1/realtime/robot/openpi)
// drives the maze when its metadata says so (robot_episode.js mazeProblem). It drives
// the simulator world (a world whose /v1/models entry says `simulator`, maze-sim) or a
// world model of the same 64x64 keys world (maze), judged by the simulator in lockstep.
// One episode at a time; its result stays on the panel until the next one. Its sockets
// (openpi.js, world_link.js) live for one episode and are not opened again by themselves,
// as the world and speech panels' are: a drop ends the episode with its error, since the
// worlds it drove are gone with their sessions and a resumed episode would be another run.
//
// state (window.demo.robot; read by tests/e2e/test_web_robot.py):
//   policies, placeholder, canDrive, modes, running, sessionId, frame, calls, framesDrawn
//   {camera, truth}, mapsDrawn (the map layout's map, once per observation),
//   chunksDrawn, chunks (the last CHUNKS_KEPT: {call, executed, rows}),
//   executed (each executed frame's held keys, e.g. "wj"; at most the budget's),
//   result ({success, reason, frames, calls, ...}), lastError

import { $, showError } from "./dom.js";
import { KEYS } from "./keys.js";
import { randomId } from "./net.js";
import { RobotEpisode, mazeProblem } from "./robot_episode.js";

const CHUNKS_KEPT = 5; // chunks drawn side by side (and kept in state)
const CELL = 9; // px per frame x key in the chunk strip
const GAP = 6; // px between chunks
const LABEL = 14; // px of key labels at the left
// One colour per key row: movement keys warm, look keys cool.
const KEY_COLOURS = ["#ffb44f", "#ff7f50", "#ff5f6d", "#f75fb0", "#5fb3ff", "#4cc3c3", "#6f8cff", "#4cc38a"];
// The map window's channels (models/maze/seen_map.py: wall, floor, red, yellow, blue object),
// drawn in this order so that an object shows over its wall or floor; unknown cells stay black.
const MAP_COLOURS = [[150, 156, 166], [52, 58, 68], [230, 60, 50], [240, 200, 40], [60, 110, 240]];
const ROBOT_COLOUR = [255, 255, 255];

export class RobotPanel {
  constructor(models) {
    this.policies = models.filter((m) => m.kind === "policy");
    this.worlds = models.filter((m) => m.kind === "world" && m.available);
    this.policy = this.policies.find((p) => p.available) || null;
    this.episode = null;
    this.state = {
      policies: this.policies.map((p) => p.name), placeholder: true, canDrive: false, modes: [],
      running: false, sessionId: null, frame: 0, calls: 0, framesDrawn: { camera: 0, truth: 0 }, mapsDrawn: 0,
      chunksDrawn: 0, chunks: [], executed: [], result: null, lastError: null,
    };
  }

  start() {
    if (!this.policies.length) return;
    this.#showMetadata();
    const problem = this.#problem();
    if (problem) {
      $("robot-placeholder").textContent = problem;
      this.state.placeholder = false;
      return;
    }
    $("robot-placeholder").hidden = true;
    this.state.placeholder = false;
    this.state.canDrive = true;
    this.#fillChoices();
    $("robot-drive").hidden = false;
    $("robot-start").addEventListener("click", () => this.run());
    $("robot-stop").addEventListener("click", () => this.episode?.stop());
    this.#drawChunks();
  }

  /** Start an episode with the toolbar's choices; resolves to its result. */
  async run() {
    if (this.episode) return null;
    const s = this.state;
    const [kind, world] = $("robot-mode").value.split(":");
    const budget = Number.parseInt($("robot-budget").value, 10);
    const seed = Number.parseInt($("robot-seed").value, 10);
    if (!(budget >= 1 && budget <= 10000) || !(seed >= 0 && Number.isSafeInteger(seed))) {
      this.#error("budget must be 1..10000 frames and the maze a whole number from 0");
      return null;
    }
    Object.assign(s, { running: true, sessionId: randomId("robot"), frame: 0, calls: 0, chunksDrawn: 0, chunks: [], executed: [],
                       result: null, lastError: null, framesDrawn: { camera: 0, truth: 0 }, mapsDrawn: 0 });
    this.#error("");
    $("robot-result").textContent = "–";
    $("robot-truth-figure").hidden = kind !== "dream";
    $("robot-map-figure").hidden = this.policy.metadata.state_layout !== "map";
    $("robot-camera-caption").textContent = kind === "dream" ? `policy camera: world model ${world}` : "policy camera: simulator";
    this.#buttons();
    this.#drawChunks();
    this.episode = new RobotEpisode({
      id: s.sessionId, prompt: $("robot-goal").value, seed, budget,
      sim: this.sim.name, dream: kind === "dream" ? world : null, view: this.#view(),
    });
    const result = await this.episode.run();
    this.episode = null;
    s.running = false;
    s.result = result;
    if (result.reason === "error") this.#error(result.message);
    $("robot-status").textContent = "done";
    $("robot-result").textContent = describeResult(result);
    this.#buttons();
    return result;
  }

  // ------------------------------------------------------------------ setup
  #problem() {
    if (!this.policy) return "The server lists no available policy.";
    const why = mazeProblem(this.policy.metadata);
    if (why) return `Policy ${this.policy.name} is served at /v1/realtime/robot/openpi (OpenPI), but ${why}, so it cannot drive the maze here.`;
    this.sim = this.worlds.find((w) => w.simulator) || null;
    if (!this.sim) return "The robot drives the maze simulator world, which this server does not serve (realtime serve --models maze,maze-sim).";
    return null;
  }

  #fillChoices() {
    const goals = $("robot-goal");
    for (const prompt of this.policy.metadata.prompts || ["go to the red wall"]) goals.append(new Option(prompt, prompt));
    const modes = $("robot-mode");
    modes.append(new Option(`simulator (${this.sim.name})`, `sim:${this.sim.name}`));
    // World models that draw the same 64x64 keys world one frame a chunk.
    for (const w of this.worlds) {
      if (w.simulator || w.height !== 64 || w.width !== 64 || w.frames_per_chunk !== 1) continue;
      if (!(w.control_schemas || []).includes("keys.v1")) continue;
      modes.append(new Option(`world model (${w.name})`, `dream:${w.name}`));
    }
    this.state.modes = [...modes.options].map((o) => o.value);
  }

  #showMetadata() {
    const box = $("robot-policies");
    for (const policy of this.policies) {
      const title = document.createElement("h3");
      title.textContent = policy.available ? policy.name : `${policy.name} (unavailable)`;
      const { name, kind, available, metadata, ...rest } = policy;
      box.append(title, facts({ ...rest, ...(metadata || {}) }));
    }
  }

  // ------------------------------------------------------------------ view
  #view() {
    const s = this.state;
    return {
      status: (text) => { $("robot-status").textContent = text; },
      infer: (ms) => { $("robot-infer").textContent = `${ms.toFixed(0)} ms`; },
      frame: (which, chunk, frame) => {
        drawRgb($(which === "camera" ? "robot-camera" : "robot-truth"), chunk);
        s.framesDrawn[which] += 1;
        s.frame = frame;
        $("robot-frame").textContent = String(frame);
      },
      map: (floats, pose) => {
        drawMap($("robot-map"), floats, pose);
        s.mapsDrawn += 1;
      },
      executed: (held) => {
        s.executed.push(held.join("")); // at most the budget's frames
        $("robot-keys").textContent = held.length ? held.join(" ").toUpperCase() : "–";
      },
      chunk: (actions, executed, call) => {
        const rows = Array.from({ length: actions.shape[0] }, (_, t) => actions.row(t));
        s.chunks.push({ call, executed, rows });
        if (s.chunks.length > CHUNKS_KEPT) s.chunks.shift();
        s.chunksDrawn += 1;
        s.calls = call;
        $("robot-calls").textContent = String(call);
        this.#drawChunks();
      },
    };
  }

  #buttons() {
    const running = this.state.running;
    for (const id of ["robot-start", "robot-goal", "robot-seed", "robot-mode", "robot-budget"]) $(id).disabled = running;
    $("robot-stop").disabled = !running;
  }

  #error(text) {
    this.state.lastError = text || null;
    showError($("robot-error"), text);
  }

  /** The last chunks, newest right: a column per frame, a row per key (KEYS order). */
  #drawChunks() {
    const canvas = $("robot-chunks");
    const horizon = this.policy.metadata.action_horizon || 8;
    const block = horizon * CELL + GAP;
    canvas.width = LABEL + CHUNKS_KEPT * block;
    canvas.height = KEYS.length * CELL + 12;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#0d1014";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = "9px monospace";
    ctx.textBaseline = "top";
    KEYS.forEach((k, r) => {
      ctx.fillStyle = KEY_COLOURS[r];
      ctx.fillText(k.toUpperCase(), 2, r * CELL);
    });
    this.state.chunks.forEach((chunk, i) => {
      const x0 = LABEL + (CHUNKS_KEPT - this.state.chunks.length + i) * block;
      chunk.rows.forEach((bits, t) => {
        bits.forEach((b, r) => {
          const executed = t < chunk.executed;
          ctx.globalAlpha = b > 0.5 ? (executed ? 1 : 0.3) : (executed ? 0.12 : 0.05);
          ctx.fillStyle = b > 0.5 ? KEY_COLOURS[r] : "#8c96a3";
          ctx.fillRect(x0 + t * CELL, r * CELL, CELL - 1, CELL - 1);
        });
      });
      ctx.globalAlpha = 1;
      ctx.fillStyle = "#8c96a3";
      ctx.fillText(`#${chunk.call}`, x0, KEYS.length * CELL + 2);
    });
  }
}

/** Draw one rgb8 chunk frame into `canvas` (sized to it). */
function drawRgb(canvas, { header, frame }) {
  const { width, height } = header;
  if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
  const rgba = new Uint8ClampedArray(width * height * 4);
  for (let i = 0, j = 0; i < frame.length; i += 3, j += 4) {
    rgba[j] = frame[i];
    rgba[j + 1] = frame[i + 1];
    rgba[j + 2] = frame[i + 2];
    rgba[j + 3] = 255;
  }
  canvas.getContext("2d").putImageData(new ImageData(rgba, width, height), 0, 0);
}

/**
 * Draw the map layout's window (`pose` floats, then channel-major 0/1 cells [c][i][j], j cells
 * ahead and i to the right of the robot) with ahead up: pixel (x = i, y = side - 1 - j).
 */
function drawMap(canvas, floats, pose) {
  const side = Math.round(Math.sqrt((floats.length - pose) / MAP_COLOURS.length));
  if (canvas.width !== side || canvas.height !== side) Object.assign(canvas, { width: side, height: side });
  const rgba = new Uint8ClampedArray(side * side * 4);
  for (let k = 3; k < rgba.length; k += 4) rgba[k] = 255;
  const paint = (i, j, [r, g, b]) => {
    const at = ((side - 1 - j) * side + i) * 4;
    rgba[at] = r;
    rgba[at + 1] = g;
    rgba[at + 2] = b;
  };
  MAP_COLOURS.forEach((colour, c) => {
    for (let i = 0; i < side; i += 1) {
      for (let j = 0; j < side; j += 1) {
        if (floats[pose + (c * side + i) * side + j] > 0.5) paint(i, j, colour);
      }
    }
  });
  const centre = (side - 1) / 2;
  paint(centre, centre, ROBOT_COLOUR);
  canvas.getContext("2d").putImageData(new ImageData(rgba, side, side), 0, 0);
}

function describeResult(r) {
  const calls = `${r.calls} policy call${r.calls === 1 ? "" : "s"}`;
  if (r.reason === "reached") return `reached (${r.prompt}) in ${r.frames} frames, ${calls}`;
  if (r.reason === "budget") return `missed: ${r.frames} frames spent (${calls})`;
  if (r.reason === "stopped") return `stopped after ${r.frames} frames`;
  return `failed after ${r.frames} frames`;
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

"""The page's robot panel in a real Chromium against a real server: the maze policy drives.

The server holds the trained maze policy, the maze simulator world (``maze-sim``) and a
tiny random-weight ``maze`` world model (the dream). The page speaks OpenPI itself
(clients/web/msgpack.js, openpi.js), so its codec is checked here byte for byte against
the Python encoder (``protocols.openpi.pack``, itself byte-equal to openpi-client's).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import httpx
import msgpack
import numpy as np
import pytest
import torch

from models.maze.planner import goal_sim
from models.maze.seen_map import MAP_CHANNELS, MAP_FLOATS, MAP_POSE, MAP_RADIUS, MAP_SIDE, map_info
from models.maze.sim import MazeSim
from models.maze.sim_world import MazeSimWorld, goal_for
from models.policy.maze.adapter import MazePolicy
from models.policy.maze.episodes import Episodes, call_seed
from models.policy.maze.model import KEYS_STATE, policy_state
from models.world.maze.adapter import MazeWorld
from models.world.maze.model import MazeDiT, MazeDiTConfig
from models.world.maze.weights import save_weights
from protocols import openpi
from protocols.world_v1 import KEY_NAMES
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve
from tests.e2e.test_web import CHROMIUM, Page, browser, pytestmark  # noqa: F401 - the shared fixture

SEED = 3


@pytest.fixture(scope="module")
def robot_server(tmp_path_factory) -> Iterator[str]:
    torch.manual_seed(0)
    weights = tmp_path_factory.mktemp("robot") / "tiny_world.safetensors"
    save_weights(MazeDiT(MazeDiTConfig(dim=64, depth=2, heads=1)), weights, extra={"steps": 0})
    inventory = Inventory()
    for adapter in (MazeWorld(weights=weights, max_sessions=4, max_batch=2), MazeSimWorld(), MazePolicy(max_batch=2)):
        inventory.adapters[adapter.name] = adapter
    config = ServerConfig(world=WorldConfig(models=("maze", "maze-sim")), policy=PolicyConfig(policy=""),
                          tts=TTSConfig(enabled=False))
    with serve(build_app(config, inventory)) as addr:
        yield addr


@pytest.fixture
def page(browser, robot_server) -> Iterator[Page]:
    p = Page(browser, robot_server)
    p.wait("demo.robot.canDrive")
    yield p
    p.close()


def imported(p: Page, module: str, body: str, arg: Any = None) -> Any:
    """Run ``body`` (an async function body with ``m``, the module, and ``arg``) in the page."""
    return p.page.evaluate(f"async (arg) => {{ const m = await import('/web/{module}'); {body} }}", arg)


# ---------------------------------------------------------------------------- codec
INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**53 - 1,
        -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**53 + 1]
FLOATS = [0.5, -1.25, 1e300, -3.0e-7]
STR_LENGTHS = [0, 31, 32, 255, 256, 65535, 65536]
BIN_LENGTHS = [0, 255, 256, 65536]


def python_values() -> list[Any]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    state = rng.standard_normal(35).astype(np.float32)
    obs = {"image": image, "state": state, "prompt": "go to the red wall", "sampling_params": {"seed": call_seed(7, 2)}}
    return [obs, INTS, FLOATS, ["é" * n if n < 300 else "x" * n for n in STR_LENGTHS],
            [bytes(range(256)) * (n // 256) if n >= 256 else bytes(n) for n in BIN_LENGTHS],
            [None, True, False, 2**63 - 1, 2**64 - 1, -2**63], list(range(15)), list(range(16)),
            {f"k{i}": i for i in range(15)}, {f"k{i}": [i] for i in range(16)},
            np.arange(6, dtype=np.int64).reshape(2, 3), np.array([1.5, -2.0], np.float64),
            np.array([[1, 0], [0, 1]], np.float32), np.zeros((0, 8), np.float32)]


JS_VALUES = """
  const bytes = (n) => { const b = new Uint8Array(n); if (n >= 256) b.forEach((_, i) => { b[i] = i % 256; }); return b; };
  return [
    {image: new m.NdArray("|u1", [64, 64, 3], Uint8Array.from(arg.image.match(/../g), (h) => parseInt(h, 16))),
     state: new m.NdArray("<f4", [35], Float32Array.from(arg.state)),
     prompt: "go to the red wall", sampling_params: {seed: BigInt(arg.seed)}},
    arg.ints, arg.floats, arg.strs.map((n) => (n < 300 ? "é".repeat(n) : "x".repeat(n))),
    arg.bins.map(bytes),
    [null, true, false, 2n ** 63n - 1n, 2n ** 64n - 1n, -(2n ** 63n)],
    Array.from({length: 15}, (_, i) => i), Array.from({length: 16}, (_, i) => i),
    Object.fromEntries(Array.from({length: 15}, (_, i) => [`k${i}`, i])),
    Object.fromEntries(Array.from({length: 16}, (_, i) => [`k${i}`, [i]])),
    new m.NdArray("<i8", [2, 3], BigInt64Array.from([0n, 1n, 2n, 3n, 4n, 5n])),
    new m.NdArray("<f8", [2], Float64Array.from([1.5, -2.0])),
    new m.NdArray("<f4", [2, 2], Float32Array.from([1, 0, 0, 1])),
    new m.NdArray("<f4", [0, 8], new Float32Array(0)),
  ].map((v) => Array.from(m.pack(v), (b) => b.toString(16).padStart(2, "0")).join(""));
"""


def js_args() -> dict[str, Any]:
    obs = python_values()[0]
    return {"image": obs["image"].tobytes().hex(), "state": obs["state"].tolist(),
            "seed": str(obs["sampling_params"]["seed"]), "ints": INTS, "floats": FLOATS,
            "strs": STR_LENGTHS, "bins": BIN_LENGTHS}


def test_the_page_packs_exactly_the_bytes_python_packs(page: Page):
    got = imported(page, "msgpack.js", JS_VALUES, js_args())
    want = python_values()
    assert len(got) == len(want)
    for i, (js, value) in enumerate(zip(got, want)):
        assert bytes.fromhex(js) == openpi.pack(value), i


def test_the_page_unpacks_what_the_server_sends(page: Page):
    actions = (np.arange(64, dtype=np.float32).reshape(8, 8) % 3 == 0).astype(np.float32)
    reply = openpi.pack({"actions": actions, "policy_timing": {"infer_ms": 12.5}, "server_timing": {"infer_ms": 13.0},
                         "n": np.int32(-7), "f": np.float32(0.25), "ints": INTS, "big": 2**63 - 1,
                         "s": "é" * 40, "b": b"\x00\x01", "nested": [[{"x": None}]]})
    got = imported(page, "msgpack.js", """
        const v = m.unpack(Uint8Array.from(arg));
        return {shape: v.actions.shape, dtype: v.actions.dtype, rows: [0, 1, 7].map((i) => v.actions.row(i)),
                timing: v.policy_timing, server: v.server_timing, n: v.n, f: v.f, ints: v.ints,
                big: v.big.toString(), s: v.s, b: Array.from(v.b), nested: v.nested};
    """, list(reply))
    assert got == {"shape": [8, 8], "dtype": "<f4", "rows": [actions[i].tolist() for i in (0, 1, 7)],
                   "timing": {"infer_ms": 12.5}, "server": {"infer_ms": 13.0}, "n": -7, "f": 0.25, "ints": INTS,
                   "big": str(2**63 - 1), "s": "é" * 40, "b": [0, 1], "nested": [[{"x": None}]]}


def test_malformed_messages_are_msgpack_errors(page: Page):
    good = list(openpi.pack({"actions": np.zeros((8, 8), np.float32)}))
    cases = {
        "truncated": good[:-3],
        "trailing": good + [0xc0],
        "huge array count": [0xdd, 0xff, 0xff, 0xff, 0xff],
        "deep": [0x91] * 40 + [0xc0],
        "ext type": [0xd4, 0x01, 0x00],
        "int key": [0x81, 0x01, 0x02],
        "bad array size": list(msgpack.packb({b"__ndarray__": True, b"data": b"abc", b"dtype": "<f4",
                                                      b"shape": [1]})),
        "big-endian dtype": list(msgpack.packb({b"__ndarray__": True, b"data": b"abcd", b"dtype": ">f4",
                                                        b"shape": [1]})),
    }
    got = imported(page, "msgpack.js", """
        const out = {};
        for (const [name, bytes] of Object.entries(arg)) {
          try { m.unpack(Uint8Array.from(bytes)); out[name] = "no error"; }
          catch (e) { out[name] = `${e instanceof m.MsgpackError}: ${e.message}`; }
        }
        return out;
    """, cases)
    assert all(text.startswith("true: ") for text in got.values()), got
    assert "truncated message" in got["truncated"] and "1 bytes after the message" in got["trailing"]
    assert "nested deeper than 32" in got["deep"] and "unsupported array dtype \">f4\"" in got["big-endian dtype"]


def test_the_state_and_the_call_seeds_are_the_python_robots(page: Page):
    yaws = [0.0, 0.1234567, -2.9, 3.14159, 1.0e-3]
    history = [[1, 0, 0, 0, 0, 1, 0, 0], [0] * 8, [1] * 8, [0, 0, 1, 0, 0, 0, 0, 1]]
    got = imported(page, "robot_episode.js", """
        return {states: arg.yaws.map((y, i) => Array.from(m.mazeState(Math.fround(y), (i % 3 - 1) * 3, 12,
                                                           arg.history.map((h) => Float32Array.from(h))))),
                seeds: [[0, 0], [3, 5], [10000, 99], [2 ** 40, 7]].map(([s, c]) => m.callSeed(s, c).toString())};
    """, {"yaws": yaws, "history": history})
    for i, y in enumerate(yaws):
        want = policy_state(torch.tensor([y], dtype=torch.float32), torch.tensor([(i % 3 - 1) * 3]),
                            torch.tensor([history], dtype=torch.float32))[0].numpy()
        # cos / sin: JS rounds the double result, torch computes in float32 (1 ulp apart at most).
        np.testing.assert_allclose(np.array(got["states"][i], np.float32), want, rtol=2e-7, atol=1e-7)
    assert got["seeds"] == [str(call_seed(s, c)) for s, c in ((0, 0), (3, 5), (10000, 99), (2**40, 7))]


def test_the_map_state_is_the_python_episodes(page: Page):
    # The map layout: the page appends maze-sim's info map (seen_map.map_info) to the keys part.
    ep = Episodes([0], "marker", layout="map")
    for _ in range(12):
        ep.step(torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 1.0]]))   # forward and turning right
    state = ep.observe()[1][0].numpy()
    info = map_info(ep.map.state()[0])
    got = imported(page, "robot_episode.js", """
        const tail = m.mapFloats(arg.info, arg.n);
        let bad = "";
        try { m.mapFloats({pose: arg.info.pose, cells: "AAAA"}, arg.n); } catch (e) { bad = e.message; }
        return {tail: Array.from(tail), bad,
                state: Array.from(m.mazeState(Math.fround(arg.yaw), arg.pitch, 12, arg.history.map((h) => Float32Array.from(h)), tail))};
    """, {"info": info, "n": MAP_FLOATS, "yaw": float(ep.sim.yaw[0]), "pitch": int(ep.sim.pitch[0]),
          "history": ep.history[0].tolist()})
    assert np.array_equal(np.array(got["tail"], np.float32), state[KEYS_STATE:])
    np.testing.assert_allclose(np.array(got["state"], np.float32), state, rtol=2e-7, atol=1e-7)
    assert got["bad"] == f"the simulator's map has 4 + 24 floats, the policy reads {MAP_FLOATS}"


# ---------------------------------------------------------------------------- episodes
def resimulate(prompt: str, executed: list[str], seed: int = SEED) -> tuple[MazeSim, int | None]:
    """The simulator after the keys the page says it executed, and the frame (1-based) after
    which it first reached the goal (None: never)."""
    sim = MazeSim([seed], goals=[goal_for(seed, prompt)])
    reached = None
    for frame, held in enumerate(executed, 1):
        sim.step(torch.tensor([[1.0 if k in held else 0.0 for k in KEY_NAMES]]))
        if reached is None and bool(sim.reached()[0]):
            reached = frame
    return sim, reached


def canvas(p: Page, cid: str) -> np.ndarray:
    got = p.js(f"""(() => {{ const c = document.getElementById("{cid}");
        return {{h: c.height, w: c.width, px: Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data)}};
    }})()""")
    return np.array(got["px"], np.uint8).reshape(got["h"], got["w"], 4)


def start(p: Page, goal: str, mode: str, budget: int) -> dict:
    p.page.select_option("#robot-goal", goal)
    p.page.fill("#robot-seed", str(SEED))
    p.page.select_option("#robot-mode", mode)
    p.page.fill("#robot-budget", str(budget))
    p.page.click("#robot-start")
    p.wait("demo.robot.result !== null", timeout_s=90)
    return p.js("demo.robot")


def test_the_policy_drives_the_simulator_and_its_chunks_are_drawn(page: Page):
    assert page.js("demo.robot.modes") == ["sim:maze-sim", "dream:maze"]
    goals = page.js("[...document.querySelectorAll('#robot-goal option')].map((o) => o.value)")
    assert "go to the red wall" in goals and "find the blue marker" in goals
    budget = 10
    s = start(page, "find the yellow marker", "sim:maze-sim", budget)
    r = s["result"]
    assert r["reason"] in ("budget", "reached") and s["lastError"] is None, r
    # Goals are 4+ cells from the start: 10 frames (1.1 cells) cannot reach one.
    assert (r["reason"], r["frames"], r["calls"], r["prompt"], r["seed"]) == (
        "budget", budget, math.ceil(budget / 4), "find the yellow marker", SEED)
    assert s["framesDrawn"] == {"camera": budget + 1, "truth": 0} and s["chunksDrawn"] == r["calls"]
    assert [c["executed"] for c in s["chunks"]] == [4, 4, 2]
    assert all(len(c["rows"]) == 8 and all(len(row) == 8 for row in c["rows"]) for c in s["chunks"])
    # The camera shows the simulator after exactly the keys drawn as executed.
    assert s["executed"] == ["".join(k for k, b in zip(KEY_NAMES, row) if b > 0.5)
                             for c in s["chunks"] for row in c["rows"][:c["executed"]]]
    sim, _ = resimulate("find the yellow marker", s["executed"])
    assert np.array_equal(canvas(page, "robot-camera")[..., :3], sim.render()[0].numpy())
    # Held keys are drawn lit in the strip (some key is held in any real chunk of 8 frames).
    strip = canvas(page, "robot-chunks")
    assert any(b > 0.5 for c in s["chunks"] for row in c["rows"][:c["executed"]] for b in row)
    assert int(strip[..., :3].max()) > 200
    # The map the policy read at its last call, drawn ahead up: the Python episode's after the
    # keys executed before that call.
    assert s["mapsDrawn"] == r["calls"]
    assert (page.shown("#robot-map-figure"), page.shown("#robot-truth-figure")) == (True, False)
    ep = Episodes([SEED], "marker", layout="map", goals=[goal_for(SEED, "find the yellow marker")])
    for held in s["executed"][:budget - s["chunks"][-1]["executed"]]:
        ep.step(torch.tensor([[1.0 if k in held else 0.0 for k in KEY_NAMES]]))
    window = ep.map.state()[0, MAP_POSE:].view(MAP_CHANNELS, MAP_SIDE, MAP_SIDE).numpy()
    want = np.zeros((MAP_SIDE, MAP_SIDE, 3), np.uint8)
    for c, colour in enumerate([(150, 156, 166), (52, 58, 68), (230, 60, 50), (240, 200, 40), (60, 110, 240)]):
        want[window[c].T[::-1] > 0.5] = colour    # [i, j] -> pixel (x = i, y = side - 1 - j)
    want[MAP_RADIUS, MAP_RADIUS] = 255
    assert np.array_equal(canvas(page, "robot-map")[..., :3], want)
    assert page.js("document.getElementById('robot-result').textContent").startswith(f"missed: {budget} frames spent")
    page.screenshot("#robot-panel", "robot-sim.png")
    assert page.console_errors == []


def test_the_episode_ends_when_the_simulator_says_the_goal_is_reached(page: Page):
    # Maze 0's evaluation episode, which the policy solves in ~50 frames here (its chunks
    # depend on the CPU's float rounding: the check is that the page's verdict is the
    # simulator's, at the frame the re-simulated keys reach the goal).
    prompt = goal_sim([0], "wall").goals[0].prompt()
    page.page.fill("#robot-seed", "0")
    page.page.select_option("#robot-goal", prompt)
    page.page.fill("#robot-budget", "80")
    page.page.click("#robot-start")
    page.wait("demo.robot.result !== null", timeout_s=90)
    s = page.js("demo.robot")
    r = s["result"]
    _, reached = resimulate(prompt, s["executed"], seed=0)
    assert len(s["executed"]) == r["frames"] and s["framesDrawn"]["camera"] == r["frames"] + 1
    if r["reason"] == "reached":
        assert (reached, r["success"]) == (r["frames"], True)
        assert page.js("document.getElementById('robot-result').textContent") == (
            f"reached ({prompt}) in {r['frames']} frames, {r['calls']} policy calls")
    else:
        assert (r["reason"], r["frames"], reached) == ("budget", 80, None)


def test_the_policy_dreams_in_the_world_model_judged_by_the_simulator(page: Page):
    s = start(page, "go to the red wall", "dream:maze", 6)
    r = s["result"]
    assert (r["reason"], r["frames"], r["calls"], r["world"]) == ("budget", 6, 2, "maze"), r
    assert s["framesDrawn"] == {"camera": 7, "truth": 7}
    assert page.shown("#robot-truth-figure")
    sim, _ = resimulate("go to the red wall", s["executed"])
    assert np.array_equal(canvas(page, "robot-truth")[..., :3], sim.render()[0].numpy())
    # The random-weight world model draws something else than the simulator.
    assert not np.array_equal(canvas(page, "robot-camera")[..., :3], sim.render()[0].numpy())
    page.screenshot("#robot-panel", "robot-dream.png")
    assert page.console_errors == []


def test_stop_ends_the_episode_and_frees_its_sessions(page: Page):
    page.page.select_option("#robot-mode", "sim:maze-sim")
    page.page.fill("#robot-budget", "10000")
    page.page.click("#robot-start")
    page.wait("demo.robot.calls >= 2")
    running = [(x["kind"], x["session_id"]) for x in httpx.get(f"http://{page.addr}/v1/sessions").json()["data"]]
    assert page.js("document.getElementById('robot-goal').disabled") is True
    page.page.click("#robot-stop")
    page.wait("demo.robot.result !== null")
    s = page.js("demo.robot")
    assert s["result"]["reason"] == "stopped" and s["lastError"] is None and not s["running"]
    # The episode's sessions, listed while it ran (the policy's under the episode id, its
    # world's as <id>-sim), are gone after the stop (the world panel's own session stays).
    sid = s["sessionId"]
    assert {("policy", sid), ("world", f"{sid}-sim")} <= set(running)
    live: list = []
    for _ in range(50):
        live = [(x["kind"], x["session_id"]) for x in httpx.get(f"http://{page.addr}/v1/sessions").json()["data"]]
        if not any(name.startswith(sid) for _, name in live):
            break
        page.page.wait_for_timeout(100)
    assert not any(name.startswith(sid) for _, name in live), live
    assert page.js("document.getElementById('robot-start').disabled") is False


def test_a_bad_budget_is_refused_on_the_page(page: Page):
    page.page.fill("#robot-budget", "0")
    page.page.click("#robot-start")
    assert page.js("demo.robot.lastError") == "budget must be 1..10000 frames and the maze a whole number from 0"
    assert page.js("demo.robot.running") is False and page.js("demo.robot.result") is None
    assert page.shown("#robot-error")


def test_the_maze_world_shows_no_first_image_or_trajectory_row(page: Page):
    # maze, the page's first world here as by default, takes neither: the rows take no room.
    assert page.js("[demo.panels.world.el.model.value, demo.models.find((m) => m.name === 'maze').takes_image]") == [
        "maze", False]
    assert page.js("demo.models.find((m) => m.name === 'maze').control_schemas") == ["keys.v1"]
    assert (page.shown("#world-image-row"), page.shown("#world-trajectory-form")) == (False, False)
    assert (page.shown("#robot-drive"), page.shown("#robot-placeholder")) == (True, False)
    assert page.hidden_but_rendered() == []

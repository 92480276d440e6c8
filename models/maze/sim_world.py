"""``MazeSimWorld`` (factory row ``maze-sim``): the goal simulator itself, served as a world.

Where the ``maze`` world *generates* every frame after the first, this world
renders each frame in the true simulator (``sim.py``, with ``goals.py``'s goal
walls or markers and their beacons), so a world.v1 client steers the real maze
with the same keys.v1 events. It is the robot's simulator on the server: the
demo page's robot panel drives it with the maze policy (clients/web/robot.js),
and judges a dream in the ``maze`` world by driving it in lockstep.

A session
---------
* ``seed`` picks the maze and the start pose (``make_maze``); the prompt picks the
  goal: a prompt naming a goal ("go to the red wall", ``goals.parse_prompt``)
  places that goal kind's three objects in the maze and makes the named colour
  the target: the evaluation's episode of the maze and kind (``planner.goal_sim``)
  when it names that episode's target, else ``make_goals(..., colour)``; a prompt
  naming none shows no goals,
  and the frames are then bit-identical to the goal-less simulator the ``maze``
  world was trained on. A later prompt repaints the goals from the next tick on,
  from the camera's current pose. A maze that cannot take the goal (a start
  walled in, ``goals.make_goals``) fails the session's first tick with that reason.
* Frame 0 of chunk 0 is the start view (its keys are ignored, as in ``maze``);
  every other frame is one ``MazeSim.step`` under its keys, then a render.
* Every chunk carries ``info`` (world.v1 ``chunk.info``) about its last frame:
  ``x``, ``y`` (grid units), ``yaw`` (radians, the simulator's float32 value),
  ``pitch`` (horizon rows), and with a goal ``goal`` (``kind``, ``colour``,
  ``cell``) and ``reached``: whether the camera reached the target after any
  frame of the chunk (``MazeSim.reached``, the evaluation's success rule), and
  ``map``: the robot's map as seen after that frame (``seen_map.map_info``; it looks
  down the corridors after every frame, as ``Episodes`` does), the ``map`` state
  layout's floats for a robot that drives this world (the demo page).

A tick computes the new pose (and map) on the session's simulator and keeps those
from before it; ``end_tick(committed=False)`` puts them back, so a dropped tick leaves
the session where it was. Rendering is ~5 ms a frame on one CPU core (torch),
a session holds a 15x15 grid and a pose: ``max_sessions`` bounds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from models.base import ModelError
from models.factory import BuildOptions, FactoryError
from models.maze.goals import GoalEpisode, make_goals, parse_prompt
from models.maze.seen_map import SeenMap, map_info
from models.maze.sim import FPS, H, W, MazeSim, SimState, make_maze
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick, action_bits


@dataclass
class _Session:
    seed: int
    prompt: str | None
    sim: MazeSim
    seen: SeenMap | None                 # the robot's map as seen (with a goal)
    # The pose and the map (SeenMap.snapshot) before the tick in flight (None: none in flight).
    before: tuple[SimState, tuple[torch.Tensor, torch.Tensor] | None] | None = None

    def keep(self) -> None:
        self.before = (self.sim.state(), None if self.seen is None else self.seen.snapshot())

    def step(self, bits: list[float]) -> None:
        self.sim.step(torch.tensor([bits]))
        if self.seen is not None:
            self.seen.look(torch.ones(1, dtype=torch.bool))


def goal_for(seed: int, prompt: str | None) -> GoalEpisode | None:
    """The goal episode a prompt names in maze ``seed`` (None: the prompt names no goal).
    ``ValueError`` when the maze cannot take that goal."""
    try:
        kind, colour = parse_prompt(prompt or "")
    except ValueError:
        return None
    grid, start, _ = make_maze(seed)
    # The evaluation's episode of this maze and kind (its target colour drawn, not named)
    # when the prompt names that colour, so its prompt shows the very same episode here.
    drawn = make_goals(seed, kind, grid, start)
    return drawn if drawn.colour == colour else make_goals(seed, kind, grid, start, colour)


class MazeSimWorld(WorldAdapter):
    """The maze simulator with goals as a world (see the module docstring)."""

    name = "maze-sim"
    uses_prompts = True

    def __init__(self, *, frames_per_chunk: int = 1, max_batch: int = 32, max_sessions: int = 256,
                 height: int = H, width: int = W) -> None:
        """``height`` x ``width``: the render size (64 x 64, the maze world's; 480 x 832 gives
        codecs rendered corridors at a world model's size, bench/world/bench_h264.py)."""
        if not 1 <= frames_per_chunk <= 4:
            raise ValueError(f"frames_per_chunk must be 1..4, got {frames_per_chunk}")
        self.geometry = WorldGeometry(height=height, width=width, frames_per_chunk=frames_per_chunk, fps=FPS)
        self.max_batch = max_batch
        self.max_sessions = max_sessions
        self._sessions: dict[str, _Session] = {}
        self._admitted: set[str] = set()

    def details(self) -> Mapping[str, Any]:
        return {"simulator": True, "max_sessions": self.max_sessions,
                "start": "every frame is rendered by the maze simulator; the prompt picks the goal "
                         "(e.g. 'go to the red wall', 'find the blue marker'); chunk info has the pose "
                         "and whether the goal is reached"}

    def admit(self, session_id: str, options: Mapping[str, Any]) -> str | None:
        if session_id in self._sessions or session_id in self._admitted:
            return None
        held = len(self._sessions) + len(self._admitted)
        if held >= self.max_sessions:
            return f"world {self.name} holds its limit of {self.max_sessions} sessions"
        self._admitted.add(session_id)
        return None

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        # One small simulator per session: a render is a handful of tensor ops on 64x64,
        # cheap enough that batching sessions into one MazeSim would not pay for its bookkeeping.
        try:
            return [self._tick(w) for w in works]
        except BaseException:
            # The engine re-runs a failed batch one tick at a time: the sessions stepped
            # before the failure go back to their poses, so none moves twice.
            for w in works:
                self.end_tick(w.session_id, committed=False)
            raise

    def _tick(self, w: WorldTick) -> WorldChunk:
        s = self._sessions.get(w.session_id)
        if w.chunk_index == 0 or s is None:
            s = self._open(w)
            s.keep()
            frames = [s.sim.render()[0]]
            actions = w.actions[1:]
            reached = s.sim.goals is not None and bool(s.sim.reached()[0])
        else:
            if w.prompt != s.prompt:
                self._repaint(s, w)
            s.keep()
            frames, actions, reached = [], w.actions, False
        for keys in actions:
            s.step(action_bits(keys))
            frames.append(s.sim.render()[0])
            reached = reached or (s.sim.goals is not None and bool(s.sim.reached()[0]))
        return WorldChunk(w.session_id, w.request_id, w.chunk_index, w.applied_event_ids,
                          torch.stack(frames).numpy(), info=self._info(s, reached))

    def _open(self, w: WorldTick) -> _Session:
        self._admitted.discard(w.session_id)
        goal = self._goal(w.seed, w.prompt)
        sim = MazeSim([w.seed], goals=None if goal is None else [goal], height=self.geometry.height,
                      width=self.geometry.width)
        s = self._sessions[w.session_id] = _Session(w.seed, w.prompt, sim, None if goal is None else SeenMap(sim))
        return s

    def _repaint(self, s: _Session, w: WorldTick) -> None:
        goal = self._goal(s.seed, w.prompt)
        pose = s.sim.state()
        s.sim = MazeSim([s.seed], goals=None if goal is None else [goal], height=self.geometry.height,
                        width=self.geometry.width)
        s.sim.set_state(pose)
        s.prompt = w.prompt
        # The corridors seen stay seen; the new goal objects are found from here on.
        seen = None if goal is None else SeenMap(s.sim)
        if seen is not None and s.seen is not None:
            seen.seen |= s.seen.seen
        s.seen = seen

    def _goal(self, seed: int, prompt: str | None) -> GoalEpisode | None:
        try:
            return goal_for(seed, prompt)
        except ValueError as exc:  # the client's seed and prompt: say so, fail this session only
            raise ModelError(f"world {self.name}: {exc}; pick another seed") from None

    @staticmethod
    def _info(s: _Session, reached: bool) -> dict[str, Any]:
        sim = s.sim
        info: dict[str, Any] = {"x": float(sim.pos[0, 0]), "y": float(sim.pos[0, 1]),
                                "yaw": float(sim.yaw[0]), "pitch": int(sim.pitch[0])}
        if sim.goals is not None:
            g = sim.goals[0]
            info["goal"] = {"kind": g.kind, "colour": g.colour, "cell": list(g.target_cell)}
            info["reached"] = reached
        if s.seen is not None:
            info["map"] = map_info(s.seen.state()[0])
        return info

    def end_tick(self, session_id: str, committed: bool) -> None:
        s = self._sessions.get(session_id)
        if s is None or s.before is None:
            return
        if not committed:
            pose, seen = s.before
            s.sim.set_state(pose)
            if s.seen is not None and seen is not None:
                s.seen.restore(seen)
        s.before = None

    def drop_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._admitted.discard(session_id)

    def reset(self, session_id: str) -> None:
        # The next tick is chunk 0 and builds the maze again; the admission stays.
        if self._sessions.pop(session_id, None) is not None:
            self._admitted.add(session_id)

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)


# ``maze-sim?size=HxW``: the render size, even (4:2:0 video) and at most 1080 x 1920.
MAX_SIZE = (1080, 1920)


def parse_options(options: Sequence[tuple[str, str]]) -> tuple[int, int]:
    """The entry's options -> the render size (``size=480x832``; default 64 x 64). A
    ``ValueError`` names a bad one."""
    size = (H, W)
    for key, value in options:
        if key != "size":
            raise ValueError(f"unknown maze-sim option {key!r} (it takes size=HEIGHTxWIDTH)")
        h, x, w = value.partition("x")
        if not (x and h.isdigit() and w.isdigit()):
            raise ValueError(f"size={value!r}: expected HEIGHTxWIDTH, e.g. size=480x832")
        size = (int(h), int(w))
        if not all(16 <= n <= most and n % 2 == 0 for n, most in zip(size, MAX_SIZE)):
            raise ValueError(f"size={value}: each side even, 16..{MAX_SIZE[0]} x 16..{MAX_SIZE[1]}")
    return size


def build(path: str | None, options: BuildOptions) -> MazeSimWorld:
    """Factory-table entry ``maze-sim``; it has no weights and takes no path. Its one option,
    ``size=480x832``, renders at a world model's size (codecs measured on corridors and turns)."""
    if path is not None:
        raise FactoryError("maze-sim is the simulator and takes no path")
    height, width = parse_options(options.model_options)
    kwargs: dict[str, Any] = {"frames_per_chunk": options.frames_per_chunk or 1, "height": height, "width": width}
    if options.max_batch is not None:
        kwargs["max_batch"] = options.max_batch
    try:
        return MazeSimWorld(**kwargs)
    except ValueError as exc:
        raise FactoryError(f"maze-sim: {exc}") from exc

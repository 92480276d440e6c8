"""MazeWorld behind the ModelAdapter seam, served through kv/'s paged cache (CPU, a tiny checkpoint)."""

import numpy as np
import pytest
import torch

from models.base import ModelError
from models.maze.sim import MazeSim
from models.world.base import WorldTick
from models.world.maze.adapter import MazeWorld
from models.world.maze.cache import FrameCache
from models.world.maze.model import MazeDiTConfig
from models.world.maze.rollout import SamplerConfig, frame_noise, next_frame, to_model, write_frame
from models.world.maze.weights import load_model

TINY = MazeDiTConfig(dim=64, depth=2, heads=1)  # the config of conftest.py's `weights`


def tick(sid: str, ci: int, *keys: str, seed: int = 0) -> WorldTick:
    return WorldTick(session_id=sid, request_id=f"{sid}-{ci}", chunk_index=ci, applied_event_ids=(ci,),
                     prompt=None, actions=tuple(frozenset(k) for k in keys), seed=seed)


def play(world: MazeWorld, ticks: list[WorldTick], committed: bool = True):
    out = world.run_batch(ticks)
    for c in out:
        world.end_tick(c.session_id, committed)
    return out


def test_describe_and_geometry(weights):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    d = w.describe()
    assert (d["kind"], d["name"], d["denoising_steps"], d["window_frames"], d["train_steps"]) == (
        "world", "maze", 2, 2, 3)
    assert (d["height"], d["width"], d["fps"], d["control_schemas"], d["uses_prompts"]) == (
        64, 64, 15.0, ["keys.v1"], False)
    g = w.geometry
    assert (g.height, g.width, g.frames_per_chunk, g.fps) == (64, 64, 1, 15.0)
    k = w.kv_geometry  # what kv/ plans with: the wire geometry carries no cache fields
    assert (k.num_layers, k.kv_heads, k.head_dim, k.tokens_per_frame, k.sink_frames, k.window_frames,
            k.itemsize) == (2, 1, 64, 256, 1, 2, w.dtype.itemsize)
    # float32 on most CPUs; bfloat16 where the CPU computes it faster (cpu_dtype.py)
    assert w.dtype in (torch.float32, torch.bfloat16)


def test_first_chunk_is_the_simulators_start_frame_and_echoes_ids(weights):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    (c,) = play(w, [tick("s", 0, "w", seed=11)])
    assert (c.session_id, c.request_id, c.chunk_index, c.applied_event_ids) == ("s", "s-0", 0, (0,))
    assert c.frames.shape == (1, 64, 64, 3) and c.frames.dtype == np.uint8
    assert np.array_equal(c.frames[0], MazeSim([11]).render()[0].numpy())


def test_paged_serving_matches_the_contiguous_cache_path(weights):
    """kv's paged attention gives the frames the evaluation's contiguous cache gives."""
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4,
                  dtype=torch.float32)  # the reference is float32 (a native-bf16 CPU may time bf16 faster)
    frames = [play(w, [tick("s", 0, "", seed=3)])[0].frames[0]]
    keys = ["w", "w", "l", "wl", "", "a", "s", "j"]
    for i, k in enumerate(keys, 1):
        frames.append(play(w, [tick("s", i, k)])[0].frames[0])

    model = load_model(weights)
    cache = FrameCache(TINY, 1, w.window, "cpu")
    view = cache.view()
    first = MazeSim([3]).render()
    write_frame(model, view, to_model(first), torch.zeros(1, 8), torch.tensor([0]), w.window)
    ref = [first[0].numpy()]
    for i, k in enumerate(keys, 1):
        a = torch.tensor([[1.0 if c in k else 0.0 for c in "wasdijkl"]])
        idx = torch.tensor([i])
        x0, _ = next_frame(model, view, a, idx, w.window, SamplerConfig(steps=w.steps),
                           noise=frame_noise(torch.tensor([3]), idx))
        ref.append(((x0.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(1, -1)[0].numpy())
    diff = np.abs(np.stack(frames).astype(int) - np.stack(ref).astype(int))
    assert diff.max() <= 1 and diff.mean() < 1e-3


def test_dropped_tick_leaves_the_session_as_it_was(weights):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    play(w, [tick("s", 0, "")])
    play(w, [tick("s", 1, "w")])
    free, frames = w.cache.num_free_blocks, w.cache.committed_frames("s")
    assert frames == 2
    play(w, [tick("s", 2, "l")], committed=False)
    assert (w.cache.num_free_blocks, w.cache.committed_frames("s")) == (free, frames)
    play(w, [tick("s", 2, "l")])
    assert w.cache.committed_frames("s") == 3


def test_batches_mix_new_and_running_sessions_and_reset_restarts(weights):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    play(w, [tick("a", 0, "", seed=1)])
    out = play(w, [tick("a", 1, "w"), tick("b", 0, "", seed=2)])
    assert np.array_equal(out[1].frames[0], MazeSim([2]).render()[0].numpy())
    assert (w.cache.committed_frames("a"), w.cache.committed_frames("b")) == (2, 1)
    # chunk_index 0 again (a reset): the world starts over from its seed.
    (c,) = play(w, [tick("a", 0, "", seed=4)])
    assert np.array_equal(c.frames[0], MazeSim([4]).render()[0].numpy())
    assert w.cache.committed_frames("a") == 1
    with pytest.raises(ModelError):
        w.run_batch([tick("a", 1, "w", "w")])   # two actions for a one-frame chunk
    w.drop_session("a")
    w.drop_session("a")
    w.drop_session("b")
    assert w.cache.num_resident == 0


def test_multi_frame_chunks(weights):
    w = MazeWorld(weights=weights, frames_per_chunk=3, max_sessions=2, max_batch=2)
    (c,) = play(w, [tick("s", 0, "", "w", "w", seed=6)])
    assert c.frames.shape == (3, 64, 64, 3)
    assert np.array_equal(c.frames[0], MazeSim([6]).render()[0].numpy())
    (c,) = play(w, [tick("s", 1, "l", "l", "l")])
    assert c.frames.shape == (3, 64, 64, 3) and w.cache.committed_frames("s") == 6
    # A dropped multi-frame tick restarts the world (its first frames were already kept).
    play(w, [tick("s", 2, "w", "w", "w")], committed=False)
    assert "s" not in w.cache
    (c,) = play(w, [tick("s", 2, "", "", "", seed=6)])
    assert np.array_equal(c.frames[0], MazeSim([6]).render()[0].numpy())


def test_shipped_weights_load():
    w = MazeWorld(max_sessions=1, max_batch=1)
    d = w.describe()
    assert (d["params"], d["train_steps"], d["config"]["dim"]) == (5_599_792, 13269, 192)


def test_a_failed_batch_leaves_no_open_chunk(weights, monkeypatch):
    """The engine's path on a model error: end_tick(False) for each, then the sessions run again."""
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    play(w, [tick("old", 0, "", seed=1)])
    play(w, [tick("old", 1, "w")])

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(w, "_generate", boom)
    with pytest.raises(RuntimeError):
        w.run_batch([tick("new", 0, "", seed=2), tick("old", 2, "w")])
    for sid in ("new", "old"):
        w.end_tick(sid, False)
    assert "new" not in w.cache                      # its start was never kept: it starts again
    assert w.cache.committed_frames("old") == 2 and not w.cache.in_flight("old")
    monkeypatch.undo()
    out = play(w, [tick("new", 0, "", seed=2), tick("old", 2, "w")])
    assert np.array_equal(out[0].frames[0], MazeSim([2]).render()[0].numpy())
    assert (w.cache.committed_frames("new"), w.cache.committed_frames("old")) == (1, 3)


def test_warm_up_builds_every_bucket_and_leaves_kv_as_found(weights):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cuda_graphs=True, warm_up=False)
    free = w.cache.num_free_blocks
    assert w.warm_up() >= 0
    assert sorted(w._runners) == [1, 2, 4]
    assert (w.cache.num_free_blocks, w.cache.num_resident, w.cache.session_ids) == (free, 0, [])
    (c,) = play(w, [tick("s", 0, "", seed=2)])                  # serving after warm-up is unaffected
    assert np.array_equal(c.frames[0], MazeSim([2]).render()[0].numpy())


def test_a_batch_commits_and_aborts_each_session_by_its_own_end_tick(weights):
    """end_tick queues commits until the batch's last one; an aborted row keeps its old frames."""
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4)
    play(w, [tick("a", 0, "", seed=1), tick("b", 0, "", seed=2)])
    out = w.run_batch([tick("a", 1, "w"), tick("b", 1, "w")])
    w.end_tick("a", True)
    assert w.cache.committed_frames("a") == 1                # queued until the batch's last end_tick
    w.end_tick("b", False)
    assert (w.cache.committed_frames("a"), w.cache.committed_frames("b")) == (2, 1)
    assert not w.cache.in_flight("a") and not w.cache.in_flight("b")
    # b's dropped frame is made again under the same chunk index, a goes on.
    out2 = w.run_batch([tick("a", 2, "w"), tick("b", 1, "w")])
    for c in out2:
        w.end_tick(c.session_id, True)
    assert (w.cache.committed_frames("a"), w.cache.committed_frames("b")) == (3, 2)
    assert len(out) == len(out2) == 2


def test_kv_from_last_step_serves_what_the_evaluation_measures(weights):
    """kv_from_last (no clean pass): the paged adapter's frames equal the contiguous cache's."""
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4, kv_from_last=True, shift=1 / 9,
                  dtype=torch.float32)  # the reference is float32 (a native-bf16 CPU may time bf16 faster)
    assert (w.details()["passes_per_frame"], w.details()["kv_from_last_step"]) == (2, True)
    frames = [play(w, [tick("s", 0, "", seed=3)])[0].frames[0]]
    keys = ["w", "w", "l", "wl", "", "a", "s", "j"]
    for i, k in enumerate(keys, 1):
        frames.append(play(w, [tick("s", i, k)])[0].frames[0])
    model = load_model(weights)
    view = FrameCache(TINY, 1, w.window, "cpu").view()
    first = MazeSim([3]).render()
    write_frame(model, view, to_model(first), torch.zeros(1, 8), torch.tensor([0]), w.window)
    ref = [first[0].numpy()]
    sampler = SamplerConfig(steps=2, shift=1 / 9, kv_from_last=True)
    for i, k in enumerate(keys, 1):
        a = torch.tensor([[1.0 if c in k else 0.0 for c in "wasdijkl"]])
        idx = torch.tensor([i])
        x0, _ = next_frame(model, view, a, idx, w.window, sampler, noise=frame_noise(torch.tensor([3]), idx))
        ref.append(((x0.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(1, -1)[0].numpy())
    diff = np.abs(np.stack(frames).astype(int) - np.stack(ref).astype(int))
    assert diff.max() <= 1 and diff.mean() < 1e-3


def test_cpu_number_format_is_timed_only_where_bf16_is_native(weights, monkeypatch):
    import models.world.maze.adapter as adapter

    w = MazeWorld(weights=weights, max_sessions=2, max_batch=2)
    if not adapter.native_bf16():
        assert (w.dtype, w.details()["dtype_pick"]) == (torch.float32, None)
    monkeypatch.setattr(adapter, "native_bf16", lambda: True)
    w = MazeWorld(weights=weights, max_sessions=2, max_batch=2)
    pick = w.details()["dtype_pick"]
    assert set(pick["pass_ms"]) == {"float32", "bfloat16"}
    assert pick["picked"] == min(pick["pass_ms"], key=pick["pass_ms"].get)
    assert w.dtype == getattr(torch, pick["picked"]) and w.model.embed.weight.dtype == w.dtype
    (c,) = play(w, [tick("s", 0, "", seed=1)])
    (c,) = play(w, [tick("s", 1, "w")])
    assert c.frames.shape == (1, 64, 64, 3)


def _batches_of(w: MazeWorld, ids: str) -> list[np.ndarray]:
    out = play(w, [tick(s, 0, "", seed=i) for i, s in enumerate(ids)])
    frames = [c.frames[0] for c in out]
    for ci, keys in enumerate(["w", "l", "wj", ""], 1):
        frames += [c.frames[0] for c in play(w, [tick(s, ci, keys) for s in ids])]
    return frames


@pytest.mark.parametrize("lanes, ids", [(2, "abc"), (3, "abc"), (2, "a")])
def test_cpu_lanes_split_a_batch_without_changing_a_frame(weights, lanes, ids):
    """Rows on two or three threads make the frames one thread makes, bit for bit (a row's
    noise and its kernels do not depend on the rows beside it: test_maze_replay.py), and kv
    ends up the same; a batch of one stays on the engine's thread."""
    one = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cpu_lanes=1, dtype=torch.float32)
    split = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cpu_lanes=lanes, dtype=torch.float32)
    assert (one.describe()["cpu_lanes"], split.describe()["cpu_lanes"]) == (1, lanes)
    assert np.array_equal(np.stack(_batches_of(one, ids)), np.stack(_batches_of(split, ids)))
    for s in ids:
        assert one.cache.committed_frames(s) == split.cache.committed_frames(s) == 5
        assert not split.cache.in_flight(s)


def test_a_lane_that_fails_fails_the_batch_and_leaves_no_open_chunk(weights, monkeypatch):
    w = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cpu_lanes=2)
    play(w, [tick(s, 0, "", seed=i) for i, s in enumerate("ab")])
    real, calls = w._denoise, []

    def second_lane_fails(part):
        calls.append(len(part[2]))
        if len(calls) == 2:
            raise RuntimeError("injected in a lane")
        return real(part)

    monkeypatch.setattr(w, "_denoise", second_lane_fails)
    with pytest.raises(RuntimeError, match="injected in a lane"):
        w.run_batch([tick("a", 1, "w"), tick("b", 1, "w")])
    assert calls == [1, 1]
    for s in "ab":
        w.end_tick(s, False)
        assert w.cache.committed_frames(s) == 1 and not w.cache.in_flight(s)
    monkeypatch.undo()
    play(w, [tick("a", 1, "w"), tick("b", 1, "w")])
    assert (w.cache.committed_frames("a"), w.cache.committed_frames("b")) == (2, 2)


def test_default_lanes_follow_the_free_cores(monkeypatch):
    from models import cpu_lanes

    monkeypatch.setattr(cpu_lanes, "usable_cores", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cpu_lanes.default_lanes() == 2
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert cpu_lanes.default_lanes() == 1
    assert cpu_lanes.split_rows(5, 2) == [range(0, 2), range(2, 5)]
    assert cpu_lanes.split_rows(1, 3) == [range(0, 1)]



def test_the_exact_gelu_serves_on_cpu_in_both_formats(weights):
    assert MazeWorld(weights=weights, max_sessions=1, max_batch=1, dtype=torch.float32).describe()["gelu"] == "erf"
    assert MazeWorld(weights=weights, max_sessions=1, max_batch=1, dtype=torch.bfloat16).describe()["gelu"] == "erf"
    pinned = MazeWorld(weights=weights, max_sessions=1, max_batch=1, dtype=torch.bfloat16, gelu="tanh")
    assert pinned.describe()["gelu"] == "tanh"


def test_a_lone_sessions_clean_pass_runs_ahead_and_other_kv_work_waits_for_it(weights):
    """One session on two lanes: each tick returns before its clean pass ends; a dropped tick,
    a second session and a release each wait for it, and every frame equals the one-lane frame."""
    one = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cpu_lanes=1, dtype=torch.float32)
    two = MazeWorld(weights=weights, max_sessions=4, max_batch=4, cpu_lanes=2, dtype=torch.float32)
    assert (one.describe()["clean_pass_ahead"], two.describe()["clean_pass_ahead"]) == (False, True)
    got: dict[str, list[np.ndarray]] = {"one": [], "two": []}
    for name, w in (("one", one), ("two", two)):
        got[name].append(play(w, [tick("a", 0, "", seed=4)])[0].frames[0])
        for ci, k in enumerate(["w", "l", "wl"], 1):
            got[name].append(play(w, [tick("a", ci, k)])[0].frames[0])
        play(w, [tick("a", 4, "j")], committed=False)            # dropped: waits, then aborts
        assert w.cache.committed_frames("a") == 4 and not w.cache.in_flight("a")
        got[name].append(play(w, [tick("a", 4, "j")])[0].frames[0])
        out = play(w, [tick("a", 5, "w"), tick("b", 0, "", seed=5)])  # another batch: waits first
        got[name] += [c.frames[0] for c in out]
        got[name].append(play(w, [tick("a", 6, "")])[0].frames[0])
        w.drop_session("a")
        assert "a" not in w.cache
    assert np.array_equal(np.stack(got["one"]), np.stack(got["two"]))
    assert two._ahead is None  # the release waited for the last one


def test_a_clean_pass_that_fails_ahead_loses_only_its_sessions_world(weights, monkeypatch):
    w = MazeWorld(weights=weights, max_sessions=2, max_batch=2, cpu_lanes=2)
    dropped: list[tuple[str, str]] = []
    w.set_drop_listener(lambda sid, why: dropped.append((sid, why)))
    play(w, [tick("a", 0, "", seed=1)])
    play(w, [tick("a", 1, "w")])
    real = w._clean_pass

    def fails(part):
        raise RuntimeError("injected in the clean pass")

    monkeypatch.setattr(w, "_clean_pass", fails)
    play(w, [tick("a", 2, "w")])     # its frame is out; its K/V never gets written
    monkeypatch.setattr(w, "_clean_pass", real)
    with pytest.raises(RuntimeError, match="clean pass failed"):
        w.run_batch([tick("a", 3, "w")])
    w.end_tick("a", False)
    assert dropped == [("a", "the K/V of its last frame could not be written")]
    assert "a" not in w.cache
    with pytest.raises(ModelError, match="reset or close it"):
        w.run_batch([tick("a", 3, "w")])
    (c,) = play(w, [tick("a", 0, "", seed=1)])    # a reset starts the world again
    assert np.array_equal(c.frames[0], MazeSim([1]).render()[0].numpy())
    play(w, [tick("a", 1, "w")])
    assert w.cache.committed_frames("a") == 2

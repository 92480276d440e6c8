"""tiny and cfg-tiny: a session's frames are a function of its seed, prompt and keys, bit for
bit on CPU, whatever shares its batches and after a reset."""

import numpy as np
import pytest

from models.world.base import WorldAdapter, WorldTick
from models.world.cfg.adapter import CFGWorld
from models.world.tiny import TinyWorld
from tests.support.replay import play, same

KEYS = ["", "w", "w", "l", "wl", "", "j", "a", "s", "d", "w", "w"]


def tick(sid: str, ci: int, keys: str, seed: int = 0, prompt: str = "a red door") -> WorldTick:
    return WorldTick(sid, f"{sid}-{ci}", ci, (ci,), prompt, (frozenset(keys),), seed=seed)


def make(kind: str, sessions=()) -> WorldAdapter:
    w: WorldAdapter = TinyWorld() if kind == "tiny" else CFGWorld(max_batch=4)
    if kind == "cfg":
        opts = w.check_options({"guidance_scale": 3.0, "negative_prompt": "blurry"})
        for sid in sessions:
            w.admit(sid, opts)
    return w


@pytest.mark.parametrize("kind", ["tiny", "cfg"])
def test_a_session_alone_equals_it_among_other_sessions(kind):
    """x started 4 ticks earlier (a longer history: other attention lengths), y joins later,
    the rows' order changes every tick."""
    w = make(kind, "a")
    want = play(w, [[tick("a", i, k, 9)] for i, k in enumerate(KEYS)])["a"]
    w = make(kind, "axy")
    play(w, [[tick("x", i, "d", 1, "a cave")] for i in range(4)])
    batches = []
    for i, k in enumerate(KEYS):
        b = [tick("x", i + 4, "wasd"[i % 4], 1, "a cave"), tick("a", i, k, 9)]
        if i >= 3:
            b.append(tick("y", i - 3, "jl"[i % 2], 2, "snow"))
        batches.append(b[::-1] if i % 2 else b)
    assert same(play(w, batches)["a"], want)


@pytest.mark.parametrize("kind", ["tiny", "cfg"])
def test_two_sessions_with_one_seed_make_the_same_frames_and_a_reset_replays(kind):
    w = make(kind, ["one", "two"])
    got = play(w, [[tick("one", i, k, 5), tick("two", i, k, 5)] for i, k in enumerate(KEYS)])
    assert same(got["one"], got["two"])
    w.drop_session("one")
    if kind == "cfg":
        w.admit("one", w.check_options({"guidance_scale": 3.0, "negative_prompt": "blurry"}))
    assert same(play(w, [[tick("one", i, k, 5)] for i, k in enumerate(KEYS)])["one"], got["one"])


def test_cfg_the_seed_draws_the_first_frame_and_a_chunk_0_tick_applies_it():
    """Admitted before its seed is known, a session starts from its chunk-0 tick's seed."""
    w = make("cfg", ["s"])
    seeded = play(w, [[tick("s", i, "", 7)] for i in range(3)])["s"]
    w.reset("s")
    other = play(w, [[tick("s", i, "", 8)] for i in range(3)])["s"]
    assert not np.array_equal(seeded[0], other[0])
    w.reset("s")
    assert same(play(w, [[tick("s", i, "", 7)] for i in range(3)])["s"], seeded)
    assert w.core.seed("s") == 7 and w.core.frames_made("s") == 3


def test_cfg_core_rows_are_their_own_to_the_last_bit():
    """The guided frames themselves (floats, before the image rounds them), alone and batched."""
    from models.world.cfg import CFGWorldCore

    def core(ids):
        c = CFGWorldCore(max_sessions=4)
        for sid in ids:
            c.open(sid, {"a": "a red door", "x": "a cave", "y": "snow"}[sid], "blurry", guidance_scale=3.0,
                   seed={"a": 9, "x": 1, "y": 2}[sid])
        return c

    one = core("a")
    want = [one.step(["a"])["a"].guided for _ in range(8)]
    many = core("axy")
    for _ in range(3):
        many.step(["x"])
    got = [many.step(ids)["a"].guided for ids in (["a", "x"], ["x", "a", "y"], ["y", "a"], ["a", "x", "y"]) * 2]
    assert all(g.equal(w) for g, w in zip(got, want))

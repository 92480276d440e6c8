"""A LingBot session's blocks are a function of its seed, prompt, image and camera: bit for bit
on CPU, whatever shares its batches, after a reset, a swap to host and back, or a reopen."""

from __future__ import annotations

import numpy as np
import pytest

from models.world.lingbot.checkpoint import load_components
from models.world.lingbot.pipeline import BlockRequest, LingBotPipeline

# 32 x 32 pixels: 2 x 2 tokens per latent frame, so every row-count of the transformer's
# products is a multiple of 4 (models/world/rows.py), as in the real 480 x 832 geometry.
S = 32
KEYS = [[{"w"}] * 3, [{"d"}] * 3, [set()] * 3]


@pytest.fixture(scope="module")
def components(tiny_checkpoint):
    return load_components(tiny_checkpoint)


def pipeline(components, sessions: int) -> LingBotPipeline:
    return LingBotPipeline(components, height=S, width=S, max_sessions=sessions, text_tokens=8,
                           condition_latents=2)


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (S, S, 3), dtype=np.uint8)


def blocks(pipe: LingBotPipeline, sid: str = "a") -> list[np.ndarray]:
    return [pipe.generate([BlockRequest(sid, keys=k)])[0] for k in KEYS]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_session_alone_equals_it_among_other_sessions(components):
    one = pipeline(components, 1)
    one.open("a", "a red house", image=image(0), seed=5)
    want = blocks(one)
    many = pipeline(components, 3)
    many.open("a", "a red house", image=image(0), seed=5)
    many.open("b", "snow", seed=1)
    many.open("c", "a cave", image=image(1), seed=2)
    many.generate([BlockRequest("b", keys=[{"j"}] * 3)])               # b is a block ahead
    got = []
    for i, k in enumerate(KEYS):
        reqs = [BlockRequest("b", keys=[{"j"}] * 3), BlockRequest("a", keys=k)]
        if i:
            reqs.append(BlockRequest("c", keys=[{"w"}] * 3))          # c joins later
        if i % 2:
            reqs.reverse()
        out = many.generate(reqs)
        got.append(out[[r.session_id for r in reqs].index("a")])
    assert same(got, want)


def test_reset_swap_and_reopen_replay_the_session(components):
    pipe = pipeline(components, 1)
    pipe.open("a", "a red house", image=image(0), seed=5)
    want = blocks(pipe)
    pipe.reset("a")
    assert same(blocks(pipe), want)
    pipe.reset("a", seed=6)                                            # another seed, other blocks
    other = blocks(pipe)
    assert not np.array_equal(other[0], want[0])
    pipe.reset("a", seed=5)
    got = []
    for i, k in enumerate(KEYS):
        got += [pipe.generate([BlockRequest("a", keys=k)])[0]]
        if i == 1:                                                     # one slot: b swaps a to host
            pipe.open("b", "snow", seed=1)
            pipe.generate([BlockRequest("b", keys=[{"j"}] * 3)])
            assert pipe.residency.is_swapped("a")
    assert same(got, want)
    pipe.close("a")
    pipe.close("b")
    pipe.open("a", "a red house", image=image(0), seed=5)              # e.g. after a drop
    assert same(blocks(pipe), want)


def test_streamed_frames_in_a_batch_equal_the_session_alone(components):
    """Rows with an on_frame decode frame by frame, all rows in one call per latent frame: each
    row's streamed frames are its frames alone, bit for bit, a first block (9) beside a later (12)."""
    one = pipeline(components, 1)
    one.open("a", "a red house", image=image(0), seed=5)
    want = blocks(one)
    many = pipeline(components, 2)
    many.open("b", "snow", seed=1)
    many.generate([BlockRequest("b", keys=[{"j"}] * 3)])               # b is a block ahead
    many.open("a", "a red house", image=image(0), seed=5)
    for k, w in zip(KEYS, want):
        sent = {"a": [], "b": []}
        reqs = [BlockRequest(sid, keys=keys, on_frame=lambda i, px, sid=sid: sent[sid].append((i, px)))
                for sid, keys in (("a", k), ("b", [{"j"}] * 3))]
        out = many.generate(reqs)
        assert [i for i, _ in sent["a"]] == list(range(len(w))) and len(sent["b"]) == 12
        np.testing.assert_array_equal(np.concatenate([px for _, px in sent["a"]]), w)
        np.testing.assert_array_equal(out[0], w)

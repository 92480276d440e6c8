"""The two-branch CFG world core: guidance arithmetic, branch independence, KV and state swap."""

import pytest
import torch

from models.world.cfg import CFGWorldCore, embed_prompt


def core(**kw) -> CFGWorldCore:
    return CFGWorldCore(**kw)


def test_scale_one_is_the_positive_branch_exactly_and_zero_the_negative():
    c = core()
    c.open("one", "a red door", "blurry", guidance_scale=1.0)
    c.open("zero", "a red door", "blurry", guidance_scale=0.0)
    for _ in range(3):
        out = c.step(["one", "zero"])
        assert torch.equal(out["one"].guided, out["one"].positive)
        assert torch.equal(out["zero"].guided, out["zero"].negative)
        assert not torch.equal(out["one"].positive, out["one"].negative)


def test_guided_is_neg_plus_s_times_pos_minus_neg():
    c = core()
    c.open("s", "a red door", "", guidance_scale=3.5)
    for _ in range(2):
        f = c.step(["s"])["s"]
        assert torch.allclose(f.guided, f.negative + 3.5 * (f.positive - f.negative), atol=1e-6, rtol=0)


def test_branches_are_independent_within_a_tick():
    a, b = core(seed=7), core(seed=7)
    a.open("x", "a red door", "blurry", guidance_scale=4.0)
    b.open("x", "a red door", "dark and noisy", guidance_scale=4.0)
    fa, fb = a.step(["x"])["x"], b.step(["x"])["x"]
    assert torch.equal(fa.positive, fb.positive)       # the negative prompt changes nothing here
    assert not torch.equal(fa.negative, fb.negative)
    c = core(seed=7)
    c.open("x", "a blue door", "blurry", guidance_scale=4.0)
    assert torch.equal(c.step(["x"])["x"].negative, fa.negative)   # nor the positive prompt there


def test_each_branch_keeps_its_own_kv():
    c = core()
    c.open("s", "a red door", "blurry", guidance_scale=2.0)
    for _ in range(3):
        c.step(["s"])
    pos, neg = c.cache.table("s", "positive"), c.cache.table("s", "negative")
    assert c.cache.committed_frames("s") == 3
    assert len(pos.held) == len(neg.held) == 3 and not set(pos.held) & set(neg.held)


def test_swap_moves_both_branches_and_the_last_frame_bit_exactly():
    ref = core(max_sessions=1)
    ref.open("a", "a red door", "blurry", guidance_scale=2.5)
    want = [ref.step(["a"])["a"].guided for _ in range(3)]

    c = core(max_sessions=1)
    c.open("a", "a red door", "blurry", guidance_scale=2.5)
    got = [c.step(["a"])["a"].guided for _ in range(2)]
    assert c.open("b", "a cave", guidance_scale=1.0) == []   # one slot: a goes to the host
    assert c.residency.is_swapped("a")
    m = c.residency.metrics()
    # 2 branches * (2 frames * 1 page * 2 layers * K, V * 16 tokens * 2 heads * 16 * 4 bytes) + frame 2,048
    assert m["swap_out_bytes"] == 2 * 2 * 2 * 2 * 16 * 2 * 16 * 4 + 16 * 32 * 4 == 34_816
    c.step(["b"])
    c.close("b")
    got.append(c.step(["a"])["a"].guided)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_reset_starts_again_and_close_forgets():
    c = core()
    c.open("s", "a red door", "blurry", guidance_scale=2.0)
    first = c.step(["s"])["s"].guided
    c.step(["s"])
    c.reset("s")
    assert c.cache.committed_frames("s") == 0
    assert torch.equal(c.step(["s"])["s"].guided, first)
    c.close("s")
    assert "s" not in c.cache and c.residency.metrics()["model_state_bytes"] == 0
    with pytest.raises(KeyError):
        c.step(["s"])


@pytest.mark.parametrize("bad", [-0.5, 20.5, float("nan"), float("inf"), "2", True, None])
def test_bad_guidance_scale_is_refused_and_opens_nothing(bad):
    c = core()
    with pytest.raises(ValueError, match="guidance_scale"):
        c.open("s", "a red door", guidance_scale=bad)
    assert "s" not in c.cache and c.cache.num_resident == 0


def test_prompt_embedding_is_fixed_per_text():
    assert torch.equal(embed_prompt("a red door", 8), embed_prompt("a red door", 8))
    assert not torch.equal(embed_prompt("a red door", 8), embed_prompt("a blue door", 8))
    assert torch.equal(embed_prompt("", 8), torch.zeros(8))

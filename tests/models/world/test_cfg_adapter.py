"""cfg-tiny behind the world seam: two-branch capacity figures, budgets, admission, options, reset."""

import numpy as np
import pytest
import torch

from kv.capacity import kv_budget, managed_pages, required_bytes, scratch_pages, session_bytes
from models.base import ModelError
from models.factory import BuildOptions, FactoryError, build
from models.world.base import WorldTick
from models.world.cfg import CFGWorldConfig
from models.world.cfg.adapter import CFGWorld


def tick(sid: str, index: int, prompt: str = "a red door") -> WorldTick:
    return WorldTick(sid, f"{sid}:{index}", index, (), prompt, (frozenset(),))


def test_two_branch_capacity_figures_by_hand():
    # page = 2 layers * 2 (K, V) * 16 tokens * 2 heads * 16 head_dim * 4 bytes = 8192; the state is the
    # guided frame, 16 * 32 * 4 = 2048 bytes; sink 1 + window 4 = 5 retained frames per branch.
    g = CFGWorldConfig().geometry()
    assert (g.page_bytes, g.model_state_bytes, g.num_branches) == (8192, 2048, 2)
    assert scratch_pages(g) == 2                       # one tick's page per branch (slot not shared)
    assert managed_pages(g, 1) == 2 * (5 + 1) + 2 == 14
    assert required_bytes(g, 1) == 16 * 8192 + 2048 == 133_120
    assert required_bytes(g, 2) == 26 * 8192 + 2 * 2048 == 217_088
    assert session_bytes(g) == 2 * 5 * 8192 + 2048 == 83_968


def test_the_pool_is_sized_from_the_budget_exactly():
    g = CFGWorldConfig().geometry()
    w = CFGWorld(max_batch=2, budget_bytes=required_bytes(g, 3, ticks_in_flight=2) + 100)
    assert (w.plan.capacity, w.max_batch, w.plan.required_bytes) == (3, 2, required_bytes(g, 3, 2))
    assert w.core.cache.pool.num_blocks == w.plan.num_blocks == scratch_pages(g) + managed_pages(g, 3, 2)
    assert w.describe()["kv"]["resident_sessions"] == 3


def test_kv_budget_cpu_has_no_limit_unless_given():
    assert kv_budget("cpu", fraction=0.5) == (None, 0.5)
    assert kv_budget("cpu", fraction=0.5, budget_bytes=1 << 20) == (1 << 20, 1.0)
    with pytest.raises(ValueError, match="KV budget must be positive"):
        kv_budget("cpu", fraction=0.5, budget_bytes=0)


def test_a_budget_below_one_session_fails_at_build_with_both_numbers():
    # required(1) with 4 ticks in flight (max_batch 4): (2 + 2 * (5 + 4) + 2) * 8192 + 2048 = 182272.
    with pytest.raises(FactoryError, match=r"cfg-tiny: KV cache needs 182272 bytes for one session but only 1000 "):
        build("cfg-tiny", BuildOptions(kv_budget_bytes=1000))


def test_admission_refuses_instead_of_dropping_and_frees_on_release():
    g = CFGWorldConfig().geometry()
    w = CFGWorld(max_batch=1, budget_bytes=required_bytes(g, 1), host_budget_bytes=session_bytes(g))
    opts = w.check_options({"guidance_scale": 2.0})
    assert w.admit("a", opts) is None
    assert w.admit("b", opts) is None                     # a is idle: swapped to host
    assert w.core.residency.is_swapped("a")
    refusal = w.admit("c", opts)
    assert refusal is not None and refusal.startswith("no room for a new session: it needs 82 KiB of KV memory")
    assert w.core.cache.session_ids == ["a", "b"] and w.core.residency.drops == 0
    w.drop_session("b")
    assert w.admit("c", opts) is None


def test_reset_and_an_uncommitted_tick_start_the_world_over():
    w = CFGWorld(max_batch=1)
    w.admit("s", w.check_options({}))
    first = w.run_batch([tick("s", 0)])[0].frames
    w.end_tick("s", True)
    second = w.run_batch([tick("s", 1)])[0].frames
    assert not np.array_equal(first, second)
    w.end_tick("s", False)                                # not committed: the world starts again
    assert np.array_equal(w.run_batch([tick("s", 0)])[0].frames, first)
    w.end_tick("s", True)
    w.reset("s")
    assert w.core.cache.committed_frames("s") == 0
    assert np.array_equal(w.run_batch([tick("s", 0)])[0].frames, first)


def test_a_new_prompt_changes_the_positive_branch_from_that_tick_on():
    a, b = CFGWorld(max_batch=1), CFGWorld(max_batch=1)
    for w in (a, b):
        w.admit("s", w.check_options({}))
        w.run_batch([tick("s", 0)])
        w.end_tick("s", True)
    assert not np.array_equal(a.run_batch([tick("s", 1)])[0].frames,
                              b.run_batch([tick("s", 1, prompt="a blue door")])[0].frames)
    assert torch.equal(b.core._prompts["s"][1], a.core._prompts["s"][1])  # the negative stays


def test_a_released_session_reopens_only_at_chunk_0_with_its_tick_options():
    w = CFGWorld(max_batch=1)
    opts = w.check_options({"guidance_scale": 4.0, "negative_prompt": "blurry"})
    w.admit("s", opts)
    first = w.run_batch([tick("s", 0)])[0].frames
    w.end_tick("s", True)
    w.drop_session("s")                                        # e.g. the session failed
    with pytest.raises(ModelError, match="evicted or released; reset or close it"):
        w.run_batch([tick("s", 1)])
    again = WorldTick("s", "s:0b", 0, (), "a red door", (frozenset(),), options=opts)
    assert np.array_equal(w.run_batch([again])[0].frames, first)
    assert w.core.guidance_scale("s") == 4.0

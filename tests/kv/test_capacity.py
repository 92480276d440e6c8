import dataclasses

import pytest
import torch

from kv.capacity import (CapacityError, format_bytes, managed_pages, plan_capacity, pool_blocks, required_bytes,
                         scratch_pages)
from kv.geometry import KVGeometry

GIB = 1 << 30

LINGBOT = KVGeometry(
    num_layers=40, kv_heads=40, head_dim=128, dtype=torch.bfloat16,
    tokens_per_frame=1560, block_size=1560, sink_frames=9, window_frames=9, span_frames=1,
    frames_per_tick=3, cross_tokens=512, model_state_bytes=7_488_000)

TINY = KVGeometry(
    num_layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, tokens_per_frame=1, block_size=1,
    span_frames=1, window_frames=3, sink_frames=3, frames_per_tick=3, cross_tokens=2)


def test_page_and_cross_bytes():
    assert LINGBOT.page_bytes == 1_277_952_000
    assert LINGBOT.cross_bytes == 419_430_400
    assert TINY.page_bytes == 8
    assert TINY.cross_bytes == 16


def test_tiny_geometry_figures():
    assert scratch_pages(TINY) == 3
    assert managed_pages(TINY, 1) == 11
    assert managed_pages(TINY, 2) == 17
    assert required_bytes(TINY, 1) == 128
    assert required_bytes(TINY, 2) == 192
    plan = plan_capacity(TINY, 192, fraction=1.0)
    assert plan.capacity == 2
    assert plan.num_blocks == 20
    assert plan_capacity(TINY, 191, fraction=1.0).capacity == 1


def test_tiny_geometry_fails_naming_both_numbers():
    with pytest.raises(CapacityError) as err:
        plan_capacity(TINY, 127, fraction=1.0)
    assert "127" in str(err.value) and "128" in str(err.value)


def test_lingbot_fraction_0_1_gives_the_required_budget_and_one_session():
    plan = plan_capacity(LINGBOT, 100 * GIB, fraction=0.1, requested_sessions=2)
    assert plan.required_one_bytes == 33_653_670_400
    assert plan.budget_bytes == 33_653_670_400
    assert plan.capacity == 1
    assert plan.num_blocks == 26
    assert plan.worker_blocks == 3


def test_lingbot_fraction_0_6_gives_60_gib_and_two_sessions():
    plan = plan_capacity(LINGBOT, 100 * GIB, fraction=0.6, requested_sessions=2)
    assert plan.budget_bytes == 60 * GIB == 64_424_509_440
    assert plan.capacity == 2
    assert plan.required_bytes == required_bytes(LINGBOT, 2) == 57_083_724_800
    # uncapped it is still 2: three need 62 pages + 3 * (cross + state) > 60 GiB
    assert plan_capacity(LINGBOT, 100 * GIB, fraction=0.6).capacity == 2
    assert required_bytes(LINGBOT, 3) == 80_513_779_200 > 60 * GIB


def test_ticks_in_flight_scale_the_in_flight_term():
    g = KVGeometry(num_layers=8, kv_heads=3, head_dim=64, tokens_per_frame=256, block_size=256,
                   sink_frames=1, window_frames=15)
    # maze: 128 sessions batched, one frame per tick each
    assert managed_pages(g, 128, ticks_in_flight=128) == 128 * 16 + 128 + 2
    assert pool_blocks(g, 128, 128) == 1 + 128 * 16 + 128 + 2
    assert g.page_bytes == 8 * 2 * 256 * 3 * 64 * 2


def test_branches_multiply_pages_and_cross():
    g = KVGeometry(num_layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, tokens_per_frame=1,
                   block_size=1, window_frames=3, sink_frames=3, frames_per_tick=3, cross_tokens=2,
                   branches=("positive", "negative"))
    # scratch 2*3, managed 2*(6+3)+2 = 20 -> 26 pages * 8 + 2 * 16
    assert required_bytes(g, 1) == 26 * 8 + 32


def test_bad_fraction():
    with pytest.raises(ValueError):
        plan_capacity(TINY, 1000, fraction=0.0)


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 1_116_733_440, 60 * GIB, 1 << 50)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "1.04 GiB", "60 GiB", "1024 TiB"]


def test_no_memory_limit_plans_the_requested_sessions_and_logs_human_units(caplog):
    caplog.set_level("INFO", logger="kv.capacity")
    plan = plan_capacity(LINGBOT, None, fraction=1.0, requested_sessions=2)
    assert (plan.capacity, plan.available_bytes) == (2, None)
    assert plan.required_bytes == plan.budget_bytes == required_bytes(LINGBOT, 2)
    assert plan.num_blocks == pool_blocks(LINGBOT, 2)
    plan_capacity(LINGBOT, 100 * GIB, fraction=0.6)
    assert caplog.messages == ["kv capacity: 2 sessions in 53.2 GiB (no memory limit)",
                               "kv capacity: 2 sessions in 53.2 GiB of a 60 GiB budget (0.6 of 100 GiB available)"]
    with pytest.raises(ValueError):
        plan_capacity(LINGBOT, None)


# Two CFG branches: TINY with branches positive/negative and 40 bytes of model-owned state.
TINY_CFG = KVGeometry(
    num_layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, tokens_per_frame=1, block_size=1,
    span_frames=1, window_frames=3, sink_frames=3, frames_per_tick=3, cross_tokens=2,
    branches=("positive", "negative"), model_state_bytes=40)
TINY_CFG_SHARED = dataclasses.replace(TINY_CFG, branches_share_worker_slot=True)

MIB = 1 << 20
# DreamZero-style: the LingBot geometry with two CFG branches through one shared worker
# slot and the Wan VAE causal-conv decode state (603 MiB per session) as model state.
DREAMZERO = dataclasses.replace(LINGBOT, branches=("positive", "negative"), branches_share_worker_slot=True,
                                model_state_bytes=603 * MIB)


def test_two_branches_count_pages_cross_and_state_tiny():
    # page 8 bytes, cross 2 branches * 16, state 40
    assert TINY_CFG.cross_bytes == 32
    assert scratch_pages(TINY_CFG) == 6                      # 2 branches * 3 pages
    assert scratch_pages(TINY_CFG_SHARED) == 3               # one shared worker slot
    assert managed_pages(TINY_CFG, 1) == 2 * (6 + 3) + 2 == 20
    assert managed_pages(TINY_CFG, 2) == 2 * (12 + 3) + 2 == 32
    assert required_bytes(TINY_CFG, 1) == 26 * 8 + 32 + 40 == 280
    assert required_bytes(TINY_CFG, 2) == 38 * 8 + 2 * 72 == 448
    assert required_bytes(TINY_CFG_SHARED, 1) == 23 * 8 + 72 == 256
    assert required_bytes(TINY_CFG_SHARED, 2) == 35 * 8 + 144 == 424
    # each session: 2 branches * 6 retained pages + cross + state = 96 + 72
    plan = plan_capacity(TINY_CFG_SHARED, 424, fraction=1.0)
    assert (plan.capacity, plan.num_blocks, plan.worker_blocks) == (2, 35, 3)
    assert plan_capacity(TINY_CFG_SHARED, 423, fraction=1.0).capacity == 1
    with pytest.raises(CapacityError) as err:
        plan_capacity(TINY_CFG, 279, fraction=1.0)
    assert "280" in str(err.value) and "279" in str(err.value)


def test_dreamzero_two_branches_with_the_603_mib_vae_state():
    assert DREAMZERO.model_state_bytes == 632_291_328
    assert DREAMZERO.cross_bytes == 2 * 419_430_400
    assert scratch_pages(DREAMZERO) == 3
    assert managed_pages(DREAMZERO, 1) == 44
    assert required_bytes(DREAMZERO, 1) == 47 * 1_277_952_000 + 838_860_800 + 632_291_328 == 61_534_896_128
    assert required_bytes(DREAMZERO, 2) == 109_012_320_256
    assert required_bytes(DREAMZERO, 3) == 156_489_744_384
    unshared = dataclasses.replace(DREAMZERO, branches_share_worker_slot=False)
    assert required_bytes(unshared, 1) == 65_368_752_128
    plan = plan_capacity(DREAMZERO, 139 * GIB, fraction=0.9)
    assert plan.budget_bytes == 134_325_102_182
    assert (plan.capacity, plan.required_bytes, plan.num_blocks, plan.worker_blocks) == (
        2, 109_012_320_256, 83, 3)


DREAMZERO_DROID = KVGeometry(
    num_layers=40, kv_heads=40, head_dim=128, dtype=torch.bfloat16, tokens_per_frame=880, block_size=880,
    sink_frames=1, window_frames=6, span_frames=1, frames_per_tick=2, branches=("conditional", "negative"),
    model_state_bytes=1_262_464_000, worker_slot=False)


def test_a_geometry_without_a_worker_slot_counts_and_reserves_no_scratch():
    # DreamZero-DROID's figures (the capacity docstring; models/policy/dreamzero/cache.py).
    assert DREAMZERO_DROID.page_bytes == 720_896_000 and scratch_pages(DREAMZERO_DROID) == 0
    assert managed_pages(DREAMZERO_DROID, 1) == 2 * (7 + 2) + 2 == pool_blocks(DREAMZERO_DROID, 1)
    assert required_bytes(DREAMZERO_DROID, 1) == 20 * 720_896_000 + 1_262_464_000 == 15_680_384_000
    assert required_bytes(DREAMZERO_DROID, 2) - required_bytes(DREAMZERO_DROID, 1) == 11_355_008_000
    with_slot = dataclasses.replace(DREAMZERO_DROID, worker_slot=True)
    assert scratch_pages(with_slot) == 4 and required_bytes(with_slot, 1) == 15_680_384_000 + 4 * 720_896_000
    plan = plan_capacity(DREAMZERO_DROID, 100 * GIB, fraction=0.9)
    # (0.9 * 100 GiB - 4,325,376,000) // 11,355,008,000 = 8 sessions, no worker blocks.
    assert (plan.capacity, plan.worker_blocks, plan.num_blocks) == (8, 0, 14 * 8 + 6)

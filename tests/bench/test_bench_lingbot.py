"""bench/world/bench_lingbot.py's own parts on the tiny geometry: the random build, the
per-tick phase clock, and a session's KV bytes against the capacity formula."""

from __future__ import annotations

import argparse

import torch

from bench.world.bench_lingbot import TickClock, bare, build, kv_bytes
from bench.world.lingbot_random import random_transformer
from realtime.server.inventory import on_spent_thread
from kv.capacity import session_bytes
from models.world.base import WorldTick
from models.world.lingbot.tiny_checkpoint import TINY_TRANSFORMER


def _args(**kw) -> argparse.Namespace:
    base = dict(tiny=True, height=32, width=32, vae_dtype="float32", pool_sessions=2, max_batch=1,
                denoising_steps=4, warmup_ticks=1, ticks=1,
                condition_latents=2)   # the first image's condition: 2 latent frames, not 30 (fast)
    return argparse.Namespace(**{**base, **kw})


def test_random_transformer_is_built_in_place_in_the_dtype_with_finite_scaled_weights():
    model = random_transformer(TINY_TRANSFORMER, "cpu", torch.bfloat16, seed=3)
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert all(torch.isfinite(p.float()).all() for p in params.values())
    assert torch.equal(params["blocks.0.self_attn.norm_q.weight"], torch.ones_like(params["blocks.0.self_attn.norm_q.weight"]))
    assert not params["blocks.0.ffn.0.bias"].any()
    w = params["blocks.0.ffn.0.weight"].float()   # N(0, 0.5 / fan_in)
    assert abs(w.std().item() - (0.5 / w.shape[1]) ** 0.5) < 0.3 * (0.5 / w.shape[1]) ** 0.5
    again = random_transformer(TINY_TRANSFORMER, "cpu", torch.bfloat16, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))


def test_bare_ticks_are_timed_by_phase_and_a_full_session_matches_the_formula_to_the_byte():
    device = torch.device("cpu")
    adapter, info = build(_args(denoising_steps=1), device)
    assert info["passes_per_tick"] == 2 and "reduced from 4 to 1" in info["denoising_steps_note"]
    assert info["pool_blocks"] == adapter.pipeline.cache.pool.num_blocks
    clock = TickClock(adapter.pipeline, device)
    out = on_spent_thread(bare, adapter, clock, _args(), device)
    assert len(out["tick_ms"]) == 1 and out["frames_vary"] and "bare" not in adapter.pipeline.sessions
    ticks = clock.since(0)
    assert len(ticks) == 2 and all(t["sessions"] == ["bare"] for t in ticks)
    for t in ticks:
        assert t["decode_ms"] > 0 and t["transformer_ms"] > 0 and t["swap_ms"] == 0
        assert t["total_ms"] >= t["decode_ms"] + t["transformer_ms"] - 1e-6
    assert ticks[0]["output_frames"] == 9 and ticks[1]["output_frames"] == 12

    # Until its sink and window are full a session holds less than the formula; then exactly it.
    cfg, F = adapter.pipeline.cfg, adapter.geometry.frames_per_chunk
    full = (cfg.sink_size + cfg.rolling_frames) // cfg.num_frames_per_block
    adapter.pipeline.open("k", "a cave", seed=2)
    for k in range(full + 1):
        adapter.run_batch([WorldTick("k", f"k:{k}", k, (), None, (frozenset(),) * F)])
        adapter.end_tick("k", True)
        row = kv_bytes(adapter, "k")
        assert row["equal_to_the_byte"] == (k + 1 >= full), (k, row)
    assert row["session_bytes_measured"] == session_bytes(adapter.pipeline.geometry)
    assert row["held_blocks"] == row["retained_frames_formula"] * row["pages_per_frame"]
    adapter.drop_session("k")

"""bench/world/bench_lingbot.py's own parts on the tiny geometry: the random build, the
per-tick phase clock, a session's KV bytes against the capacity formula, and the A/B mode."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
import torch

from bench.world.bench_lingbot import TickClock, bare, build, kv_bytes
from bench.world.lingbot_random import random_transformer
from realtime.server.inventory import on_spent_thread
from kv.capacity import session_bytes
from models.world.base import WorldTick
from models.world.lingbot.tiny_checkpoint import TINY_TRANSFORMER


def _args(**kw) -> argparse.Namespace:
    base = dict(tiny=True, height=32, width=32, vae_dtype="float32", pool_sessions=2, max_batch=1,
                options="", scratch="/nonexistent", warmup_ticks=1, ticks=1, seed=0,
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
    adapter, info = build(_args(options="steps=1"), device)
    assert info["passes_per_tick"] == 2 and info["shortcuts"] == "steps=1"
    assert "with the shortcuts 'steps=1'" in info["shortcuts_note"]
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


def test_the_ab_mode_measures_each_shortcut_against_the_exact_path_in_one_run(tmp_path, monkeypatch):
    pytest.importorskip("models.world.taehv")
    from bench.world.bench_lingbot import main

    out = tmp_path / "ab.json"
    argv = ["bench_lingbot", "--ab", "steps=4", "reuse_kv=1", "steps=1", "fp8=all", "decoder=taehv:random",
            "steps=2&reuse_kv=1&fp8=ffn", "--tiny", "--device", "cpu", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    on_spent_thread(main)
    result = json.loads(out.read_text())
    assert result["command"] == "python3 -m bench.world.bench_lingbot " + " ".join(argv[1:])
    assert {"torch", "python", "platform", "cpu_count"} <= set(result["env"]) and result["device"] == "cpu"
    ab = result["ab"]
    v = ab["variants"]
    assert list(v) == ["exact", "steps=4", "reuse_kv=1", "steps=1", "fp8=all", "decoder=taehv:random",
                       "steps=2&reuse_kv=1&fp8=ffn"]
    assert ab["chunks"] == 8 and ab["steady_from_chunk"] == 3   # sink 3 + 6 rolling frames: 3 blocks
    for name, row in v.items():
        assert len(row["chunk_ms"]) == len(row["passes"]) == 8 and row["steady_chunk_ms"] > 0
        assert row["passes"] == [row["passes_per_chunk"]] * 8
    assert [v[n]["passes_per_chunk"] for n in v] == [5, 5, 4, 2, 5, 5, 2]
    assert "latent_max_abs_err" not in v["exact"]
    # The harness is deterministic: the exact path again is identical, to the bit.
    assert v["steps=4"]["identical"] and v["steps=4"]["latent_max_abs_err"] == 0
    assert v["steps=4"]["frames_psnr_db"] is None and v["steps=4"]["options"] == ""
    for name in ("reuse_kv=1", "steps=1", "fp8=all", "steps=2&reuse_kv=1&fp8=ffn"):
        row = v[name]
        assert not row["identical"] and 0 < row["latent_mean_abs_err"] <= row["latent_max_abs_err"]
        assert 0 < row["frames_psnr_db"] < 200 and len(row["per_chunk"]["frames_psnr_db"]) == 8
        assert row["speed_vs_exact"] > 0
    # Only the decoder changed: the latents are the exact path's, the frames are not.
    taehv = v["decoder=taehv:random"]
    assert taehv["latent_max_abs_err"] == 0 and not taehv["identical"] and taehv["decoder"] == "taehv"
    assert v["fp8=all"]["fp8"]["layers"] == 2 * 8 and v["fp8=all"]["fp8"]["kernels"] == ["emulated"]
    # reuse_kv changes what later chunks attend to; the first reads no K/V (its committing pass
    # only runs its own block's attention on another code path: equal to rounding).
    first, second = v["reuse_kv=1"]["per_chunk"]["latent_max_abs_err"][:2]
    assert first < 1e-5 < 1e-3 < second

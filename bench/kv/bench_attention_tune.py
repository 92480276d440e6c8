#!/usr/bin/env python3
"""Tune paged attention for the maze geometry against contiguous SDPA, in one short run.

    python bench/kv/bench_attention_tune.py --out $OUT/kv_attention_tune.json     # H200, < 100 s
    python bench/kv/bench_attention_tune.py --no-flex --out $OUT/kv_attention_tune.json   # ~40 s
    python bench/kv/bench_attention_tune.py --quick --out /tmp/tune.json          # CPU smoke test

Maze geometry: 8 layers, 3 heads x 64, 256 tokens per frame = one 256-token block,
sink 1 + window 15 frames held + the 1-frame chunk = 17 pages (4,352 keys) per row,
bf16, batches of 1, 32 and 128 sessions. One fragmented pool (the free queue is
shuffled first) serves every batch size, so the compiled flex kernels see one pool
shape and compile once per kernel config for all batches >= 2.

Stages, each saved to the JSON as it finishes (a timeout keeps what was done),
each skipped once the ``--budget-s`` deadline is near:

1. per layer, contiguous SDPA on the same K/V laid out ``[R, H, S, D]`` (default
   dispatch = the baseline; also bshd, and cuDNN / flash called directly);
2. per layer, every paged backend: gather + SDPA / flash / cuDNN, ``triton``
   (kv.triton_paged with its default tiles and split count) and each
   ``TRITON_TRIALS`` variant at every batch, flex with torch's default kernel
   options, then flex with each ``FLEX_TRIALS`` config (b32 and b128 first; b1
   only for the best flex config, as b1 is a separate compile);
3. per tick (all 8 layers, the comparison that counts): 8 contiguous SDPA calls vs
   building the batch's plans (gather indices / block mask, once per tick) plus 8
   paged calls, for the best candidates (always ``triton`` and the best triton
   variant), with and without the per-layer K/V write; then the same ticks
   replayed from a CUDA graph (``per_tick[b]["graph_ms"]``: kernel time without
   launch overhead, which is how the maze frame path runs);
4. optionally ``torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")``
   in a child process with whatever time is left (``--max-autotune``).

Every configuration records its time (median ms, CUDA events around a loop of
calls, so launch overhead counts) and its max abs / relative error against a
float32 SDPA on the same K/V. ``winners`` names the fastest correct paged
configuration per shape with its speed vs contiguous SDPA (goal >= 0.9);
``recommended_flex_configs`` is what to put in ``kv.paged_attention.FLEX_CONFIGS``.
``triton`` summarises kv.triton_paged per batch: default and best variant per layer
and per tick (eager and graph-replayed), each as speed vs contiguous SDPA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import subprocess
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv import graph_ms, sync, time_ms as _time_ms  # noqa: E402  (the same timers for all kv benches)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kv import paged_attention as pa  # noqa: E402
from kv.cache import PagedKVCache  # noqa: E402
from kv.geometry import KVGeometry  # noqa: E402

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")

MAZE = KVGeometry(num_layers=8, kv_heads=3, head_dim=64, tokens_per_frame=256, block_size=256,
                  sink_frames=1, window_frames=15, frames_per_tick=1, dtype=torch.bfloat16)
QUICK = dataclasses.replace(MAZE, num_layers=2, window_frames=3, tokens_per_frame=128,
                            block_size=128)

# Flex kernel configs, most promising first (H100 default for bf16 d64 is
# BLOCK_M=128, BLOCK_N=128, 4 warps, 3 stages). BLOCK_M / BLOCK_N must divide the
# 128-token block-mask tile. Smaller BLOCK_M = more programs = fuller waves.
FLEX_TRIALS = (
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "USE_TMA": True},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "PRESCALE_QK": True},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
)
# kv.triton_paged variants besides its defaults (128 x 64 tiles, 4 warps, 3 stages, split
# count from choose_splits: 17 / 2 / 1 at b1 / b32 / b128 on an H200). 128 x 128 with
# 4 warps spills registers (ptxas), so 128 x 128 runs with 8.
TRITON_TRIALS = (
    {"block_m": 64},
    {"num_warps": 8},
    {"num_stages": 2},
    {"block_n": 128, "num_warps": 8},
    {"block_m": 64, "block_n": 128},
    {"block_m": 64, "num_stages": 4},
    {"num_splits": 1},
    {"num_splits": 2},
    {"num_splits": 4},
    {"num_splits": 8},
    {"num_splits": 34},
    {"block_m": 64, "num_splits": 8},
    {"block_m": 256, "num_warps": 8},
    {"block_m": 256, "num_warps": 8, "num_splits": 2},
)
GATHER = ("gather_sdpa", "gather_flash", "gather_cudnn")
MAX_REL_ERR = 2e-2   # what AttentionDispatch accepts; bf16 SDPA itself is ~2.3e-3


def log(msg: str) -> None:
    print(f"[tune {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def time_ms(fn, device, *, target_ms=3.0, reps=7, warmup=2) -> float:
    """bench_kv's timer with this script's shorter budget."""
    return _time_ms(fn, device, target_ms=target_ms, reps=reps, warmup=warmup, max_iters=100)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = out.float() - ref
    return {"max_abs_err": d.abs().max().item(), "rel_err": (d.norm() / ref.norm()).item()}


class Setup:
    """One fragmented pool with ``sessions`` sessions, all with a full window and a chunk in flight."""

    def __init__(self, g: KVGeometry, sessions: int, batch_sizes: tuple[int, ...],
                 device: torch.device, seed: int = 0) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        self.g, self.device = g, device
        held = g.sink_frames + g.window_frames
        self.pages = (held + g.frames_per_tick) * g.pages_per_frame
        nb = 2 + sessions * self.pages + sessions  # null + pad block, a little slack
        self.cache = c = PagedKVCache(g, nb, device, max_sessions=sessions,
                                      attention_backend="gather_sdpa")
        ids = c.pool.allocate(c.pool.num_free)
        random.shuffle(ids)              # sessions get scattered blocks, like a busy server
        c.pool.free(ids)
        self.sids = [f"s{i}" for i in range(sessions)]
        for sid in self.sids:
            c.open(sid)
        for _ in range(held // g.frames_per_tick):
            c.commit_batch(c.begin_batch(self.sids))
        for layer in range(g.num_layers):
            for t in (c.storage.k[layer], c.storage.v[layer]):
                t.normal_()
                t[0].zero_()
        self.full = c.begin_batch(self.sids)           # every chunk in flight
        self.lq = g.frames_per_tick * g.tokens_per_frame
        H, D = g.kv_heads, g.head_dim
        self.k_cur = [torch.randn(sessions, self.lq, H, D, device=device, dtype=g.dtype)
                      for _ in range(g.num_layers)]
        self.v_cur = [torch.randn_like(k) for k in self.k_cur]
        for layer in range(g.num_layers):
            c.write(layer, self.full, self.k_cur[layer], self.v_cur[layer])
        self.q = {b: torch.randn(b, self.lq, H, D, device=device, dtype=g.dtype)
                  for b in batch_sizes}
        self.batches = {b: (self.full if b == sessions else c.batch(self.sids[:b]))
                        for b in batch_sizes}
        self.nb = nb

    def contiguous(self, b: int, layer: int):
        """The K/V of batch ``b`` for one layer, laid out ``[R, H, S, D]`` contiguously."""
        g, c = self.g, self.cache
        batch = self.batches[b]
        idx = batch.block_tables[:, :self.pages].reshape(-1).long()
        S = self.pages * g.block_size
        out = []
        for pool in (c.storage.k[layer], c.storage.v[layer]):
            out.append(pool.index_select(0, idx).view(b, S, g.kv_heads, g.head_dim)
                       .transpose(1, 2).contiguous())
        return out

    def reference(self, b: int, layer: int) -> torch.Tensor:
        """float32 SDPA over the contiguous K/V: ``[R, Lq, H, D]``."""
        k, v = self.contiguous(b, layer)
        qh = self.q[b].transpose(1, 2)
        return torch.cat([F.scaled_dot_product_attention(qh[i:i + 16].float(), k[i:i + 16].float(),
                                                         v[i:i + 16].float())
                          for i in range(0, b, 16)]).transpose(1, 2)


def contiguous_fns(s: Setup, b: int, device: torch.device) -> dict:
    k, v = s.contiguous(b, 0)
    qh = s.q[b].transpose(1, 2).contiguous()
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (qh, k, v))  # bshd strides
    fns = {"sdpa_bhsd_default": lambda: F.scaled_dot_product_attention(qh, k, v),
           "sdpa_bshd_default": lambda: F.scaled_dot_product_attention(qs, ks, vs)}
    if device.type == "cuda":
        fns["sdpa_bhsd_cudnn_direct"] = lambda: pa._cudnn_direct(qh, k, v, None)
        fns["sdpa_bhsd_flash_direct"] = lambda: pa._flash_direct(qh, k, v, None)
    return fns


def measure(fn, ref, device, transpose_out: bool) -> dict:
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - t0
    if transpose_out:
        out = out.transpose(1, 2)
    res = errors(out, ref)
    res["first_call_s"] = round(first, 3)
    res["ms"] = time_ms(fn, device)
    res["ok"] = res["rel_err"] < MAX_REL_ERR
    return res


def per_tick(s: Setup, b: int, backend: str | None, device: torch.device, write: bool) -> float:
    """ms per tick: plans built afresh (as for a new batch) + all layers; ``None`` = contiguous SDPA."""
    g, c = s.g, s.cache
    q = s.q[b]
    if backend is None:
        kv = [s.contiguous(b, layer) for layer in range(g.num_layers)]
        qh = q.transpose(1, 2)

        def tick():
            for k, v in kv:
                F.scaled_dot_product_attention(qh, k, v)
        ms = time_ms(tick, device)
        del kv
        return ms
    batch = s.batches[b]
    impl = pa._IMPLS[backend]
    k_cur = [k[:b] for k in s.k_cur]
    v_cur = [v[:b] for v in s.v_cur]

    def tick():
        batch.plans.clear()
        for layer in range(g.num_layers):
            if write:
                c.write(layer, batch, k_cur[layer], v_cur[layer])
            impl(q, c.storage.k[layer], c.storage.v[layer], batch)
    return time_ms(tick, device)


def graph_tick_ms(s: Setup, b: int, backend: str | None, device: torch.device) -> float:
    """ms per tick (all layers, no writes) replayed from a CUDA graph; ``None`` = contiguous SDPA."""
    g, c = s.g, s.cache
    q = s.q[b]
    if backend is None:
        kv = [s.contiguous(b, layer) for layer in range(g.num_layers)]
        qh = q.transpose(1, 2)

        def tick():
            for k, v in kv:
                F.scaled_dot_product_attention(qh, k, v)
    else:
        batch, impl = s.batches[b], pa._IMPLS[backend]

        def tick():
            for layer in range(g.num_layers):
                impl(q, c.storage.k[layer], c.storage.v[layer], batch)
    return graph_ms(tick, device, time_ms)


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "platform": platform.platform(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_GiB=round(p.total_memory / (1 << 30), 1),
                   sm_count=p.multi_processor_count,
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    return env


def child_max_autotune(args) -> None:
    """Child process: flex compiled with max-autotune-no-cudagraphs, b32 and b128."""
    device = torch.device("cuda")
    from torch.nn.attention.flex_attention import flex_attention
    pa._compiled_flex = torch.compile(flex_attention, dynamic=False,
                                      mode="max-autotune-no-cudagraphs")
    s = Setup(MAZE, 128, (32, 128), device)
    res = {}
    for b in (128, 32):
        ref = s.reference(b, 0)
        t = time.perf_counter()
        try:
            r = measure(lambda: pa.flex(s.q[b], s.cache.storage.k[0], s.cache.storage.v[0],
                                        s.batches[b]), ref, device, False)
        except Exception as exc:
            r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        r["wall_s"] = round(time.perf_counter() - t, 2)
        res[str(b)] = r
        with open(args.child_out, "w") as f:
            json.dump(res, f)


def triton_summary(out: dict, batch_sizes, best_triton) -> dict:
    """Per batch: kv.triton_paged (defaults and best variant) as speed vs contiguous SDPA."""
    summary = {}
    for b in batch_sizes:
        row = out["per_layer"].get(str(b), {})
        base = row.get("sdpa_bhsd_default", {}).get("ms")
        tick = out["per_tick"].get(str(b), {})
        res = {}
        default = row.get("triton", {})
        if "error" in default:
            res["error"] = default["error"]
        if base and default.get("ok"):
            res.update(per_layer_ms=default["ms"], per_layer_speed_vs_sdpa=round(base / default["ms"], 4),
                       rel_err=default["rel_err"])
        best = best_triton(b)
        if base and best:
            res.update(best_variant=best, best_per_layer_ms=row[best]["ms"],
                       best_per_layer_speed_vs_sdpa=round(base / row[best]["ms"], 4))
        tbase = tick.get("sdpa_default_ms")
        if tbase:
            for key, name in (("per_tick_speed_vs_sdpa", "triton"), ("best_per_tick_speed_vs_sdpa", best)):
                if name and isinstance(tick.get(name), float):
                    res[key] = round(tbase / tick[name], 4)
        graph = tick.get("graph_speed_vs_sdpa", {})
        for key, name in (("graph_per_tick_speed_vs_sdpa", "triton"),
                          ("best_graph_per_tick_speed_vs_sdpa", best)):
            if name in graph:
                res[key] = graph[name]
        res["speed_vs_sdpa"] = res.get("per_tick_speed_vs_sdpa", res.get("per_layer_speed_vs_sdpa"))
        summary[str(b)] = res
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=90.0,
                    help="stop starting new stages past this many seconds (default 90)")
    ap.add_argument("--no-flex", action="store_true", help="skip the flex stages (no compiles)")
    ap.add_argument("--no-triton", action="store_true", help="skip kv.triton_paged")
    ap.add_argument("--quick", action="store_true", help="tiny geometry, for a CPU smoke test")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also try mode=max-autotune-no-cudagraphs in a child, with the time left")
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_out:
        child_max_autotune(args)
        return
    t_start = time.perf_counter()
    deadline = t_start + args.budget_s

    def left() -> float:
        return deadline - time.perf_counter()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = QUICK if args.quick else MAZE
    batch_sizes = (1, 4) if args.quick else (1, 32, 128)
    trials = () if args.no_flex else FLEX_TRIALS[:2] if args.quick else FLEX_TRIALS
    # Triton runs on CUDA, or on CPU under TRITON_INTERPRET=1 (slow: --quick only).
    use_triton = (not args.no_triton and pa.triton_available()
                  and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"))
    triton_names = (["triton"] + [pa.triton_backend(o) for o in
                                  (TRITON_TRIALS[:2] if args.quick else TRITON_TRIALS)]) if use_triton else []
    out = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "environment": environment(), "device": str(device), "quick": args.quick,
           "geometry": {k: str(v) for k, v in dataclasses.asdict(g).items()},
           "goal": "paged / contiguous SDPA speed >= 0.9 (speed = sdpa_ms / paged_ms)",
           "per_layer": {}, "per_tick": {}, "skipped": [], "errors": {}}
    if not use_triton:
        out["skipped"].append("triton: " + ("--no-triton" if args.no_triton else
                                            "not installed" if not pa.triton_available() else "needs CUDA"))

    def save():
        out["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)

    log(f"device {device}, torch {torch.__version__}, budget {args.budget_s:.0f} s")
    s = Setup(g, max(batch_sizes), batch_sizes, device)
    out["pool_blocks"] = s.nb
    out["flex_configs_in_auto"] = [dict(o) for o in pa.FLEX_CONFIGS]
    out["pages_per_row"] = s.pages
    log(f"setup done: {s.nb} blocks x {g.num_layers} layers ({time.perf_counter() - t_start:.1f} s)")
    refs = {b: s.reference(b, 0) for b in batch_sizes}
    k0, v0 = s.cache.storage.k[0], s.cache.storage.v[0]

    def paged_fn(name, b):
        impl = pa._IMPLS[name]
        q, batch = s.q[b], s.batches[b]
        return lambda: impl(q, k0, v0, batch)

    def record(b, name, fn, transpose_out):
        row = out["per_layer"].setdefault(str(b), {})
        try:
            row[name] = measure(fn, refs[b], device, transpose_out)
            r = row[name]
            log(f"b{b:<4} {name:<70} {r['ms']:.4f} ms  rel {r['rel_err']:.2e}"
                f"  first {r['first_call_s']} s")
        except Exception as exc:
            row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            log(f"b{b:<4} {name:<70} error {row[name]['error'][:120]}")

    # 1 + 2: contiguous baselines and gather backends (no compiles: seconds).
    for b in batch_sizes:
        for name, fn in contiguous_fns(s, b, device).items():
            record(b, name, fn, True)
        for name in GATHER:
            record(b, name, paged_fn(name, b), False)
        save()
    # 2a: kv.triton_paged, every variant at every batch (a compile is ~1 s per variant).
    for name in triton_names:
        if left() < 8:
            out["skipped"].append(f"{name}: budget")
            continue
        for b in batch_sizes:
            record(b, name, paged_fn(name, b), False)
        save()

    def fastest(b, family):
        """The fastest backend of ``family`` (``pa.is_triton`` / ``pa.is_flex``) that ran at batch b."""
        row = out["per_layer"].get(str(b), {})
        ok = {n: r["ms"] for n, r in row.items() if family(n) and r.get("ok")}
        return min(ok, key=ok.get) if ok else None

    def best_triton(b):
        return fastest(b, pa.is_triton)

    # 2b: flex. The first flex compile pays for Inductor's warm-up (~12 s).
    flex_names = (["flex"] + [pa.flex_backend(o) for o in trials]) if not args.no_flex else []
    big = [b for b in batch_sizes if b > 1]
    for name in flex_names:
        if name != "flex" and pa.FLEX_MARK_DYNAMIC and big and all(
                "error" in out["per_layer"][str(b)].get("flex", {}) for b in big):
            # Default flex failed everywhere: try once without the dynamic batch mark.
            pa.FLEX_MARK_DYNAMIC = False
            out["flex_mark_dynamic"] = False
            log("default flex failed; retrying without marking the batch dynamic")
            for b in big:
                record(b, "flex", paged_fn("flex", b), False)
        if left() < 12:
            out["skipped"].append(f"{name}: budget")
            continue
        for b in big:
            record(b, name, paged_fn(name, b), False)
        save()

    def best_flex(b):
        return fastest(b, pa.is_flex)

    # b1: one flex compile, for the config that won at the smallest big batch.
    b1_flex = best_flex(big[0]) if big and flex_names else None
    if b1_flex and 1 in batch_sizes:
        if left() > 15:
            record(1, b1_flex, paged_fn(b1_flex, 1), False)
        else:
            out["skipped"].append(f"b1 {b1_flex}: budget")
    save()

    # 3: per tick, all layers, plans rebuilt per tick.
    for b in batch_sizes:
        if left() < 4:
            out["skipped"].append(f"per_tick b{b}: budget")
            continue
        row = out["per_layer"][str(b)]
        cands = [n for n in GATHER if row.get(n, {}).get("ok")]
        fb = best_flex(b)
        if fb and (b > 1 or fb in row):
            cands.append(fb)
        tb = best_triton(b)
        for name in dict.fromkeys(["triton", tb]):
            if name and row.get(name, {}).get("ok"):
                cands.append(name)
        tick = out["per_tick"].setdefault(str(b), {"layers": g.num_layers})
        try:
            tick["sdpa_default_ms"] = base = per_tick(s, b, None, device, False)
        except Exception as exc:
            traceback.print_exc()
            out["errors"][f"per_tick_b{b}"] = f"{type(exc).__name__}: {exc}"[:300]
            save()
            continue
        for name in cands:
            try:
                tick[name] = per_tick(s, b, name, device, False)
            except Exception as exc:
                traceback.print_exc()
                out["errors"][f"per_tick_b{b}_{name}"] = f"{type(exc).__name__}: {exc}"[:300]
        timed = [n for n in cands if isinstance(tick.get(n), float)]
        if timed:
            best = min(timed, key=lambda n: tick[n])
            try:
                tick[best + "+write"] = per_tick(s, b, best, device, True)
                tick["speed_vs_sdpa_with_write"] = round(base / tick[best + "+write"], 4)
            except Exception as exc:
                out["errors"][f"per_tick_b{b}_{best}+write"] = f"{type(exc).__name__}: {exc}"[:300]
            tick["best"] = best
            tick["speed_vs_sdpa"] = round(base / tick[best], 4)
            log(f"tick b{b}: sdpa {base:.4f} ms, best {best} {tick[best]:.4f} ms "
                f"-> {tick['speed_vs_sdpa']}x ({tick.get('speed_vs_sdpa_with_write')}x with writes)")
        # The same ticks from a CUDA graph (the maze frame path): contiguous SDPA vs triton.
        if device.type == "cuda" and left() > 3:
            graph = tick.setdefault("graph_ms", {})
            for name in [None] + [n for n in dict.fromkeys(["triton", tb]) if n and n in timed]:
                key = name or "sdpa_default"
                try:
                    graph[key] = graph_tick_ms(s, b, name, device)
                except Exception as exc:
                    traceback.print_exc()
                    graph[key] = f"error: {type(exc).__name__}: {exc}"[:300]
            if isinstance(graph.get("sdpa_default"), float):
                for name, ms in list(graph.items()):
                    if name != "sdpa_default" and isinstance(ms, float):
                        tick.setdefault("graph_speed_vs_sdpa", {})[name] = round(graph["sdpa_default"] / ms, 4)
            log(f"tick b{b} graph: {graph}")
        save()

    # 4: max-autotune, in a child so a slow compile cannot blow the budget.
    if args.max_autotune and device.type == "cuda" and not args.quick:
        budget = left() - 3
        if budget < 25:
            out["skipped"].append(f"max_autotune: only {budget:.0f} s left")
        else:
            child_out = os.path.abspath(args.out) + ".max_autotune.json"
            log(f"max-autotune child, {budget:.0f} s")
            try:
                subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out,
                                "--child-out", child_out], timeout=budget, check=False,
                               stdout=sys.stderr, stderr=sys.stderr)
                status = "finished"
            except subprocess.TimeoutExpired:
                status = f"timed out after {budget:.0f} s"
            res = {"status": status}
            if os.path.exists(child_out):
                with open(child_out) as f:
                    res["results"] = json.load(f)
                os.remove(child_out)
            out["max_autotune"] = res
            save()

    # Winners per shape: the fastest paged config whose error is within bounds.
    winners = {}
    for b in batch_sizes:
        row = out["per_layer"].get(str(b), {})
        base = row.get("sdpa_bhsd_default", {}).get("ms")
        ok = {n: r["ms"] for n, r in row.items() if not n.startswith("sdpa_") and r.get("ok")}
        if not ok or base is None:
            continue
        w = min(ok, key=ok.get)
        winners[str(b)] = {"per_layer_best": w, "per_layer_ms": ok[w], "sdpa_ms": base,
                           "per_layer_speed_vs_sdpa": round(base / ok[w], 4),
                           "per_layer_speed_by_backend": {n: round(base / t, 4)
                                                          for n, t in sorted(ok.items(), key=lambda x: x[1])}}
        tick = out["per_tick"].get(str(b))
        if tick and "best" in tick:
            winners[str(b)].update(per_tick_best=tick["best"],
                                   per_tick_speed_vs_sdpa=tick["speed_vs_sdpa"],
                                   per_tick_speed_vs_sdpa_with_write=tick.get("speed_vs_sdpa_with_write"))
    out["winners"] = winners
    # Flex configs ranked by their summed time over the batches >= 2 where all ran.
    totals = {}
    for name in flex_names[1:]:
        ts = [out["per_layer"].get(str(b), {}).get(name, {}) for b in big]
        if ts and all(t.get("ok") for t in ts):
            totals[name] = sum(t["ms"] for t in ts)
    default_total = sum(out["per_layer"].get(str(b), {}).get("flex", {}).get("ms", float("inf"))
                        for b in big)
    ranked = sorted((n for n in totals if totals[n] < default_total), key=totals.get)
    out["recommended_flex_configs"] = [dict(pa._IMPLS[n].keywords["kernel_options"])
                                       for n in ranked[:2]]
    out["triton"] = triton_summary(out, batch_sizes, best_triton) if triton_names else {}
    save()
    log(f"done in {time.perf_counter() - t_start:.1f} s -> {args.out}")
    print(json.dumps({"winners": winners, "triton": out["triton"], "per_tick": out["per_tick"],
                      "recommended_flex_configs": out["recommended_flex_configs"],
                      "skipped": out["skipped"]}, indent=1))


if __name__ == "__main__":
    main()

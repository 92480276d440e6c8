#!/usr/bin/env python3
"""GPU check of kv.triton_paged: error vs a dense fp32 reference, and speed vs SDPA, in one short run.

    python bench/kv/check_triton_paged.py --out $OUT/kv_triton_check.json      # H200, ~1 min
    TRITON_INTERPRET=1 python bench/kv/check_triton_paged.py --smoke --out /tmp/c.json   # CPU, the harness only

1. errors (bf16): the maze geometry (3 heads x 64, 256-token pages, 17 pages per row)
   at batch 1 / 32 / 128 with some rows shorter than the table (null-padded), default
   choice (at batch >= 8 on sm_90: the TMA kernel), the pointer kernel with 1 and 4
   splits, and the TMA kernel forced; the LingBot geometry (40 heads x 128, 1,560-token pages, 27
   pages, 4,680 queries) at batch 1. Reference: fp32 SDPA over each row's gathered pages.
   bf16 contiguous SDPA's own error against the same reference is listed beside it.
2. times (every row full, 17 pages): contiguous SDPA (default dispatch, ``[R, H, S, D]``),
   gather + SDPA (``index_select`` of the pages, then SDPA: what kv's ``gather_sdpa``
   does), and triton (defaults; the pointer kernel at each split count; the TMA
   kernel). Median ms of CUDA
   events around a loop of calls (launch cost included: ``eager_ms``) and of CUDA-graph
   replays (kernel time: ``graph_ms``, how the maze frame path runs). ``speed_vs_sdpa`` =
   SDPA ms / triton ms (goal >= 0.9).
3. graph: a captured triton call replayed after new q / tables / lengths are copied into
   its inputs equals an eager call on them.

Every variant's failure is recorded in the JSON (``error``) instead of stopping the run;
the JSON is rewritten after each step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv import graph_ms as _graph_ms, time_ms as _time_ms  # noqa: E402  (the kv benches' timers)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kv.triton_paged import (  # noqa: E402
    choose_splits, choose_tiles, paged_attention_triton, sm_count, triton_available)

MAZE = dict(H=3, D=64, bs=256, W=17, Lq=256)
LINGBOT = dict(H=40, D=128, bs=1560, W=27, Lq=4680)
# --smoke: tiny shapes in fp32 on CPU under the Triton interpreter (its bf16 dot is wrong)
SMOKE_MAZE = dict(H=3, D=16, bs=32, W=3, Lq=40)
SMOKE_LINGBOT = dict(H=4, D=32, bs=24, W=3, Lq=30)
DEVICE = "cuda"
DTYPE = torch.bfloat16


def log(msg: str) -> None:
    print(f"[check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def time_ms(fn) -> float:
    """Median ms per call (bench_kv's timer)."""
    return _time_ms(fn, torch.device(DEVICE), reps=9)


def graph_ms(fn) -> float:
    """Median ms per CUDA-graph replay (bench_kv's)."""
    return _graph_ms(fn, torch.device(DEVICE), _time_ms)


class Case:
    """A pool with R rows of scattered pages; ``short`` rows attend fewer pages than the table."""

    def __init__(self, geo: dict, R: int, *, short: bool, seed: int = 0) -> None:
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        H, D, bs, W, Lq = geo["H"], geo["D"], geo["bs"], geo["W"], geo["Lq"]
        self.geo, self.R = geo, R
        nb = 2 + R * W
        self.k_pool = torch.randn(nb, bs, H, D, device=DEVICE, dtype=DTYPE, generator=g)
        self.v_pool = torch.randn(nb, bs, H, D, device=DEVICE, dtype=DTYPE, generator=g)
        self.k_pool[0].zero_()
        self.v_pool[0].zero_()
        self.tables = (torch.randperm(nb - 2, device=DEVICE, generator=g)[:R * W] + 2).view(R, W).int()
        lengths = [W] * R
        if short:  # every third row attends 1, 4, 7, ... pages; the rest of its table is the null block
            for i, r in enumerate(range(0, R, 3)):
                lengths[r] = 1 + (3 * i) % W
        self.lengths_list = lengths
        self.lengths = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
        self.tables[torch.arange(W, device=DEVICE)[None, :] >= self.lengths[:, None]] = 0
        # q as the maze model hands it over: [R, H, Lq, D] transposed to [R, Lq, H, D]
        self.q = torch.randn(R, H, Lq, D, device=DEVICE, dtype=DTYPE, generator=g).transpose(1, 2)

    def gathered(self, r0: int, r1: int):
        """Rows r0..r1 (all of one length) as contiguous [n, H, S, D] K and V."""
        n = self.lengths_list[r0]
        idx = self.tables[r0:r1, :n].reshape(-1).long()
        H, D, bs = self.geo["H"], self.geo["D"], self.geo["bs"]
        return [p.index_select(0, idx).view(r1 - r0, n * bs, H, D).transpose(1, 2).contiguous()
                for p in (self.k_pool, self.v_pool)]

    def reference(self, dtype=torch.float32) -> torch.Tensor:
        """SDPA over each row's gathered pages in ``dtype``: [R, Lq, H, D] float32."""
        out = torch.empty(self.q.shape, dtype=torch.float32, device=DEVICE)
        heads = 8
        for r in range(self.R):
            k, v = self.gathered(r, r + 1)
            qh = self.q[r:r + 1].transpose(1, 2)
            for h in range(0, self.geo["H"], heads):  # bounds the fp32 LingBot call's memory
                o = F.scaled_dot_product_attention(qh[:, h:h + heads].to(dtype), k[:, h:h + heads].to(dtype),
                                                   v[:, h:h + heads].to(dtype))
                out[r:r + 1, :, h:h + heads] = o.transpose(1, 2).float()
        return out

    def triton(self, **kw):
        return lambda: paged_attention_triton(self.q, self.k_pool, self.v_pool, self.tables, self.lengths, **kw)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = out.float() - ref
    return {"max_abs_err": d.abs().max().item(), "rel_err": (d.norm() / ref.norm()).item(),
            "finite": bool(torch.isfinite(out).all())}


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "platform": platform.platform(), "triton_available": triton_available()}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count,
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--no-lingbot", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny fp32 shapes on CPU under TRITON_INTERPRET=1: exercises this script only")
    args = ap.parse_args()
    global DEVICE, DTYPE
    maze, lingbot = MAZE, LINGBOT
    if args.smoke:
        DEVICE, DTYPE, maze, lingbot = "cpu", torch.float32, SMOKE_MAZE, SMOKE_LINGBOT
        if args.batches == "1,32,128":
            args.batches = "1,4"
    out = {"check": "kv.triton_paged vs dense fp32 reference; speed vs contiguous SDPA",
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "environment": environment(), "errors": {}, "times": {}, "graph_check": {}, "failures": {}}
    t_start = time.perf_counter()

    def save():
        out["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)

    def attempt(where: str, fn):
        try:
            return fn()
        except Exception as exc:
            traceback.print_exc()
            out["failures"][where] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{where}: FAILED {out['failures'][where][:200]}")
            save()
            return None

    usable = triton_available() and (
        torch.cuda.is_available() if not args.smoke else os.environ.get("TRITON_INTERPRET") == "1")
    if not usable:
        out["failures"]["setup"] = "needs triton and CUDA (--smoke: TRITON_INTERPRET=1)"
        save()
        log(out["failures"]["setup"])
        return
    out["smoke"] = args.smoke
    log(f"{out['environment']}")
    batches = [int(b) for b in args.batches.split(",")]
    sms = sm_count(torch.device(DEVICE))
    # the TMA kernel: sm_90+, or forced under the interpreter (--smoke)
    tma_capable = args.smoke or torch.cuda.get_device_capability()[0] >= 9
    tma_kw = {"tma": True, **({"block_m": 16, "block_n": 16} if args.smoke else {})}  # smoke pages: 32 keys
    modes = (("eager_ms", time_ms),) + ((("graph_ms", graph_ms),) if DEVICE == "cuda" else ())

    # 1. errors
    geos = [("maze", maze, b) for b in batches] + ([] if args.no_lingbot else [("lingbot", lingbot, 1)])
    for name, geo, R in geos:
        key = f"{name}_b{R}"

        def check(name=name, geo=geo, R=R, key=key):
            c = Case(geo, R, short=R > 1)
            ref = c.reference()
            tiles = choose_tiles(geo["Lq"], geo["D"], geo["bs"])
            q_tiles = -(-geo["Lq"] // tiles.block_m)
            splits = choose_splits(q_tiles, R * geo["H"], geo["W"] * -(-geo["bs"] // tiles.block_n), sms)
            res = {"rows": R, "lengths": c.lengths_list if R <= 32 else "every third row short",
                   "tiles": tiles.__dict__, "default_splits": splits,
                   "sdpa_" + str(DTYPE).split(".")[-1]: errors(c.reference(DTYPE), ref)}
            variants = [("triton_default", {}), ("triton_1_split_pointers", {"num_splits": 1, "tma": False}),
                        ("triton_4_splits", {"num_splits": 4})]
            if name == "maze" and tma_capable:
                variants.append(("triton_tma", tma_kw))
            for label, kw in variants:
                r = attempt(f"errors/{key}/{label}", lambda kw=kw: errors(c.triton(**kw)(), ref))
                if r is not None:
                    res[label] = r
            return res

        res = attempt(f"errors/{key}", check)
        if res is not None:
            out["errors"][key] = res
            log(f"errors {key}: " + ", ".join(f"{k} {v['rel_err']:.2e}" for k, v in res.items()
                                              if isinstance(v, dict) and "rel_err" in v))
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        save()

    # 2. times
    for name, geo, R in geos:
        key = f"{name}_b{R}"
        c = attempt(f"times/{key}/setup", lambda geo=geo, R=R: Case(geo, R, short=False))
        if c is None:
            continue
        k, v = c.gathered(0, R)
        qh = c.q.transpose(1, 2).contiguous()
        idx = c.tables.reshape(-1).long()
        H, D, bs, W = geo["H"], geo["D"], geo["bs"], geo["W"]

        def gather_sdpa(c=c, idx=idx, R=R, H=H, D=D, bs=bs, W=W):
            kk = c.k_pool.index_select(0, idx).view(R, W * bs, H, D).transpose(1, 2)
            vv = c.v_pool.index_select(0, idx).view(R, W * bs, H, D).transpose(1, 2)
            return F.scaled_dot_product_attention(c.q.transpose(1, 2), kk, vv).transpose(1, 2)

        fns = {"sdpa_contiguous": lambda qh=qh, k=k, v=v: F.scaled_dot_product_attention(qh, k, v),
               "gather_sdpa": gather_sdpa, "triton": c.triton()}
        split_counts = ([1, 2, 4, 8, 17, 34] if name == "maze" else [1, 2]) if not args.smoke else [1, 2]
        for s in split_counts:   # the pointer kernel
            fns[f"triton_splits_{s}"] = c.triton(num_splits=s, tma=False)
        if name == "maze" and tma_capable:
            fns["triton_tma"] = c.triton(**tma_kw)
        if name == "maze" and not args.smoke:
            fns["triton_block_m_64"] = c.triton(block_m=64, tma=False)
            fns["triton_block_m_256_8_warps"] = c.triton(block_m=256, num_warps=8, tma=False)
        res = {}
        for label, fn in fns.items():
            row = {}
            for mode, timer in modes:
                ms = attempt(f"times/{key}/{label}/{mode}", lambda fn=fn, timer=timer: timer(fn))
                if ms is not None:
                    row[mode] = ms
            res[label] = row
            log(f"times {key} {label}: {row}")
        base = res.get("sdpa_contiguous", {})
        for label, row in res.items():
            if label == "sdpa_contiguous":
                continue
            for mode in ("eager_ms", "graph_ms"):
                if mode in row and mode in base:
                    row["speed_vs_sdpa_" + mode[:-3]] = round(base[mode] / row[mode], 4)
        out["times"][key] = res
        del c, k, v, qh, fns
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        save()

    # 3. graph capture / replay
    def graph_check():
        c = Case(MAZE, 32, short=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            c.triton()()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = c.triton()()
        d = Case(MAZE, 32, short=True, seed=1)
        c.q.copy_(d.q)
        c.tables.copy_(d.tables)
        c.lengths.copy_(d.lengths)
        c.lengths_list = d.lengths_list
        graph.replay()
        torch.cuda.synchronize()
        eager = c.triton()()
        return {"replay_equals_eager": bool(torch.equal(o, eager)), **errors(o, c.reference())}

    res = attempt("graph_check", graph_check) if DEVICE == "cuda" else None
    if res is not None:
        out["graph_check"] = res
        log(f"graph check: {res}")

    out["summary"] = {
        key: {label: {k: v for k, v in row.items() if k.startswith("speed")}
              for label, row in res.items() if label.startswith("triton") or label == "gather_sdpa"}
        for key, res in out["times"].items()}
    out["ok"] = (not out["failures"] and all(
        r[label]["rel_err"] < 2e-2 and r[label]["finite"] for r in out["errors"].values()
        for label in r if label.startswith("triton")))
    save()
    print(json.dumps({"summary": out["summary"], "graph_check": out["graph_check"],
                      "failures": out["failures"], "ok": out["ok"]}, indent=1))
    log(f"done in {time.perf_counter() - t_start:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()

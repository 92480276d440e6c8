"""Where the action expert's time goes: pi0 at full size, one robot, kernel by kernel.

The expert loop (10 Euler steps x 18 Gemma-300M layers over 51 suffix tokens) is the
larger half of a one-robot call on the H200 (bench/results/pi0_h200.json), yet its
arithmetic is ~0.3 TFLOP and its weights ~0.6 GB a step: it is neither compute nor
bandwidth bound. This script says which kernels it is bound by:

1. the loop as one CUDA graph (what the runner replays), per layer function variant;
2. one eager pass under ``torch.profiler``: each kernel's total time and count;
3. the layer's pieces alone (each matmul shape, the attention variants: the fused
   SDPA kernels, explicit matmuls, the expert kernel of expert_attention.py at a few
   tiles and as tuned), each replayed ``--reps`` times in one graph so that launches
   do not count; the attention at 1, 8 and 32 robots; the prefix's kernels.

    python3 -m bench.pi0.profile_expert --out /tmp/pi0_expert_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.attention  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.kv.bench_kv import graph_ms as kv_graph_ms  # noqa: E402
from bench.report import emit  # noqa: E402
from models.policy.pi0 import layers  # noqa: E402
from models.policy.pi0.config import full_size  # noqa: E402
from models.policy.pi0.expert_attention import expert_attention, expert_attention_triton, tuned  # noqa: E402
from models.policy.pi0.model import Pi0Model, suffix_ar  # noqa: E402
from models.policy.pi0.weights import build_random  # noqa: E402


def log(msg: str) -> None:
    print(f"[pi0_expert {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def graph_ms(fn: Callable[[], Any], reps: int) -> float:
    """Milliseconds per ``fn()``: ``reps`` calls captured in one graph and replayed
    (``bench.kv.bench_kv.graph_ms``), so that neither launches nor replays count."""
    return kv_graph_ms(lambda: [fn() for _ in range(reps)], torch.device("cuda")) / reps


def setup(model: Pi0Model, batch: int) -> dict[str, torch.Tensor]:
    cfg, dev = model.cfg, model.action_in_proj.weight.device
    g = torch.Generator(device=dev).manual_seed(0)
    images = torch.rand(batch, len(cfg.image_features), 3, *cfg.image_resolution, device=dev, generator=g) * 2 - 1
    tokens = torch.randint(0, 1000, (batch, cfg.tokenizer_max_length), device=dev, generator=g)
    valid = torch.zeros(batch, cfg.tokenizer_max_length, dtype=torch.bool, device=dev)
    valid[:, :12] = True
    kv = model.kv_buffer(batch, dev)
    with torch.inference_mode():
        embs, pad = model.embed_prefix(images, tuple(range(len(cfg.image_features))), tokens, valid)
        model.prefix_kv(embs, pad, kv)
        ar = torch.tensor([0] * cfg.prefix_len + suffix_ar(cfg.chunk_size), device=dev)[None].expand(batch, -1)
        state = torch.randn(batch, cfg.max_state_dim, device=dev, generator=g)
        state_emb, bias, cos, sin = model.suffix_inputs(state, pad, ar.contiguous())
    noise = torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, device=dev, generator=g)
    return {"kv": kv, "state_emb": state_emb, "bias": bias, "cos": cos, "sin": sin, "noise": noise}


def loop_fn(model: Pi0Model, t: dict[str, torch.Tensor], fns: layers.LayerFns) -> Callable[[], torch.Tensor]:
    steps = model.cfg.num_inference_steps
    model.time_bias(steps)
    return lambda: model.sample(t["noise"], steps, t["state_emb"], t["kv"], t["bias"], t["cos"], t["sin"], fns)


def kernel_table(fn: Callable[[], Any], top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None)
        if dev_us is None:
            dev_us = getattr(ev, "cuda_time_total", 0.0)
        if dev_us and ev.count and not ev.key.startswith(("cudaLaunch", "cudaStream", "cudaGraph", "cudaDevice")):
            rows.append({"kernel": ev.key[:160], "count": ev.count, "total_us": round(dev_us, 1),
                         "mean_us": round(dev_us / ev.count, 2)})
    rows.sort(key=lambda r: -r["total_us"])
    return {"kernels_total_us": round(sum(r["total_us"] for r in rows), 1),
            "launches": sum(r["count"] for r in rows), "top": rows[:top]}


def pieces(model: Pi0Model, t: dict[str, torch.Tensor], reps: int) -> dict[str, Any]:
    """One expert layer's parts at batch 1, each alone."""
    cfg, spec = model.cfg, model.cfg.expert
    dev, dt = t["kv"].device, model.dtype
    w = model.layer_weights()[1][0]
    s, width, nh, d = cfg.suffix_len, spec.width, spec.num_heads, spec.head_dim
    x = torch.randn(1, s, width, device=dev, dtype=dt)
    att = torch.randn(1, s, nh * d, device=dev, dtype=dt)
    mid = torch.randn(1, s, spec.mlp_dim, device=dev, dtype=dt)
    kv = t["kv"][0]
    k, v = kv[0], kv[1]
    q = torch.randn(1, s, nh, d, device=dev, dtype=dt)
    bias = t["bias"]
    out: dict[str, Any] = {}

    def measure(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = graph_ms(fn, reps)
        except Exception as exc:  # noqa: BLE001 - a variant the device refuses (e.g. out of shared memory)
            out[name] = f"unavailable: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}"

    with torch.inference_mode():
        measure("qkv_matmul", lambda: F.linear(x, w.qkv))
        measure("o_matmul", lambda: F.linear(att, w.o))
        measure("gate_up_matmul", lambda: F.linear(x, w.gate_up))
        measure("down_matmul", lambda: F.linear(mid, w.down))
        measure("rms_norm", lambda: F.rms_norm(x, (width,), w.in_scale, 1e-6))
        measure("attend_sdpa_rows_folded", lambda: layers.attend(q, k, v, bias))
        qh = q.transpose(1, 2)
        kh, vh = k[:, None].expand(1, nh, -1, -1), v[:, None].expand(1, nh, -1, -1)
        bh = bias.view(1, 1, s, nh, -1)[:, :, :, 0].contiguous()  # the mask is per token, not per head

        measure("attend_sdpa_heads", lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bh))

        def explicit() -> torch.Tensor:
            rows = q.reshape(1, s * nh, d)
            sc = torch.baddbmm(bias[:, 0], rows, k.transpose(1, 2), alpha=d ** -0.5)
            return torch.bmm(sc.softmax(-1), v)

        measure("attend_explicit_bmm", explicit)
        for name in ("flash", "efficient", "math", "cudnn"):
            backend = getattr(torch.nn.attention.SDPBackend, {"flash": "FLASH_ATTENTION", "efficient":
                              "EFFICIENT_ATTENTION", "math": "MATH", "cudnn": "CUDNN_ATTENTION"}[name])
            with torch.nn.attention.sdpa_kernel([backend]):
                measure(f"attend_rows_folded_{name}", lambda: layers.attend(q, k, v, bias))
        measure("expert_attention_op", lambda: expert_attention(q, k, v, bias))
        for bm, bn, warps, stages in ((64, 32, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (64, 32, 8, 2),
                                      (64, 64, 8, 3), (128, 32, 8, 2)):
            measure(f"expert_attention_triton_{bm}x{bn}_w{warps}_s{stages}",
                    lambda: expert_attention_triton(q, k, v, bias, block_m=bm, block_n=bn, num_warps=warps,
                                                    num_stages=stages))
    return {k: (round(v * 1000, 2) if isinstance(v, float) else v) for k, v in out.items()}


def batched_attention(model: Pi0Model, reps: int) -> dict[str, Any]:
    """The expert's attention at 1, 8 and 32 robots: fused SDPA vs the expert kernel."""
    spec, dev = model.cfg.expert, model.action_in_proj.weight.device
    rows, keys = model.cfg.suffix_len, model.cfg.kv_len
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for b in (1, 8, 32):
            q = torch.randn(b, rows, spec.num_heads, spec.head_dim, device=dev, dtype=model.dtype)
            k, v = (torch.randn(b, keys, spec.head_dim, device=dev, dtype=model.dtype) for _ in range(2))
            bias = torch.zeros(b, 1, rows * spec.num_heads, keys, device=dev, dtype=model.dtype)
            bias[..., -20:] = float("-inf")
            out[str(b)] = {"sdpa_us": round(1000 * graph_ms(lambda: layers.attend(q, k, v, bias), reps), 2),
                           "expert_kernel_us": round(1000 * graph_ms(lambda: expert_attention(q, k, v, bias), reps), 2),
                           "tuned": tuned(q, k, v, bias)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--modes", nargs="*", default=["eager", "default"],
                    help="layer variants: eager, or a torch.compile mode (default, max-autotune-no-cudagraphs)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = full_size()
    model = build_random(cfg, device=dev, dtype=torch.bfloat16).eval()
    model.fuse()
    res: dict[str, Any] = {"benchmark": "pi0_expert_profile", "command": " ".join(["python3", "-m",
                           "bench.pi0.profile_expert", *sys.argv[1:]]), "gpu": torch.cuda.get_device_name(),
                           "torch": torch.__version__, "suffix_tokens": cfg.suffix_len, "kv_len": cfg.kv_len,
                           "steps": cfg.num_inference_steps, "complete": False}
    t = setup(model, 1)
    res["layer_pieces_us"] = pieces(model, t, args.reps)
    log(f"pieces: {res['layer_pieces_us']}")
    res["attention_by_batch_us"] = batched_attention(model, args.reps)
    log(f"by batch: {res['attention_by_batch_us']}")
    emit(res, args.out, echo=False)
    for mode in args.modes:
        t0 = time.perf_counter()
        if mode == "eager":
            fns = layers.EAGER
        else:
            opts = {"fullgraph": True, "dynamic": None, "backend": "inductor"}
            if mode != "default":
                opts["mode"] = mode
            fns = layers.LayerFns(torch.compile(layers.prefix_layer, **opts),
                                  torch.compile(layers.expert_layer, **opts),
                                  torch.compile(layers.vision_layer, **opts), True)
        fn = loop_fn(model, t, fns)
        entry: dict[str, Any] = {}
        try:
            with torch.inference_mode():
                entry["loop_graph_ms"] = round(graph_ms(fn, 1), 3)
                entry["warm_s"] = round(time.perf_counter() - t0, 1)
                entry["profile_one_loop"] = kernel_table(fn, args.top)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next variant
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        res[f"loop_{mode}"] = entry
        log(f"{mode}: {entry.get('loop_graph_ms')} ms in a graph ({entry.get('error', 'ok')})")
        emit(res, args.out, echo=False)
    cfg1 = model.cfg
    dev1 = model.action_in_proj.weight.device
    images = torch.rand(1, len(cfg1.image_features), 3, *cfg1.image_resolution, device=dev1) * 2 - 1
    tokens = torch.zeros(1, cfg1.tokenizer_max_length, dtype=torch.long, device=dev1)
    valid = torch.ones(1, cfg1.tokenizer_max_length, dtype=torch.bool, device=dev1)

    def prefix() -> None:
        embs, pad = model.embed_prefix(images, tuple(range(len(cfg1.image_features))), tokens, valid)
        model.prefix_kv(embs, pad, t["kv"])

    with torch.inference_mode():
        res["prefix_eager_graph_ms"] = round(graph_ms(prefix, 1), 3)
        res["prefix_eager_profile"] = kernel_table(prefix, args.top)
    emit(res, args.out, echo=False)
    res["complete"] = True
    emit(res, args.out)


if __name__ == "__main__":
    main()

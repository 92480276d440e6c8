"""Where the prefix's time goes: pi0 at full size, SigLIP and Gemma-2B's attention, in CUDA graphs.

The prefix (SigLIP over every camera, then Gemma-2B over 816 tokens) is about half of a
one-robot call on the H200 (bench/results/pi0_h200.json) and all of the batched calls'
growth. This script times, each replayed from a CUDA graph (``profile_expert.graph_ms``)
so that launches do not count, at 1 and 8 robots:

1. SigLIP over the cameras: transformers' own ``SiglipVisionModel`` forward (separate
   q / k / v, eager element-wise ops), ``layers.vision_layer`` eager (q|k|v fused) and
   compiled (inductor fuses the norms, residuals and gelu), with the largest difference
   from transformers' output;
2. Gemma-2B's prefix attention (816 tokens x 8 query heads folded into 6,528 rows over one
   K/V head of 256, padding keys hidden): ``scaled_dot_product_attention`` with the bias
   (what ``layers.attend`` runs) against ``expert_attention.py``'s Triton kernel at each of
   its candidate tiles, with the difference from an fp32 reference;
3. the whole prefix (embeddings + 18 layers' K/V) with the compiled layers, both ways.

    python3 -m bench.pi0.profile_prefix --out bench/results/pi0_prefix_profile_h200.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.pi0.profile_expert import graph_ms, kernel_table  # noqa: E402
from bench.report import emit  # noqa: E402
from models.policy.pi0 import expert_attention as ea  # noqa: E402
from models.policy.pi0 import layers  # noqa: E402
from models.policy.pi0.config import LAYER_NORM_EPS, full_size  # noqa: E402
from models.policy.pi0.model import _bias  # noqa: E402
from models.policy.pi0.weights import build_random  # noqa: E402


def log(msg: str) -> None:
    print(f"[pi0_prefix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return round((a.float() - b.float()).abs().max().item(), 5)


def vision(model: Any, batch: int, compiled: layers.LayerFns, reps: int) -> dict[str, Any]:
    cfg, dev = model.cfg, model.action_in_proj.weight.device
    tower = model.paligemma_with_expert.paligemma.model.vision_tower
    pixels = (torch.rand(batch * len(cfg.image_features), 3, *cfg.image_resolution, device=dev) * 2 - 1).to(model.dtype)
    runs = {"transformers": lambda: tower.vision_model(pixel_values=pixels).last_hidden_state,
            "fused_eager": lambda: tower(pixels, layers.EAGER),
            "fused_compiled": lambda: tower(pixels, compiled)}
    ref = runs["transformers"]()
    out: dict[str, Any] = {"images": pixels.shape[0]}
    for name, fn in runs.items():
        out[f"{name}_ms"] = round(graph_ms(fn, reps), 3)
        out[f"{name}_max_abs_diff"] = max_diff(fn(), ref)
        log(f"vision x{batch}: {name} {out[f'{name}_ms']} ms")
    out["scale"] = round(ref.float().abs().max().item(), 3)
    return out


def prefix_attention(model: Any, batch: int, reps: int) -> dict[str, Any]:
    cfg, dev = model.cfg, model.action_in_proj.weight.device
    spec, length = cfg.vlm, cfg.prefix_len
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch, length, spec.num_heads, spec.head_dim, device=dev, generator=g, dtype=model.dtype)
    k = torch.randn(batch, length, spec.head_dim, device=dev, generator=g, dtype=model.dtype)
    v = torch.randn(batch, length, spec.head_dim, device=dev, generator=g, dtype=model.dtype)
    pad = torch.ones(batch, length, dtype=torch.bool, device=dev)
    pad[:, length - cfg.tokenizer_max_length + 12:] = False  # a 12-token prompt
    bias = _bias(pad[:, None, None, :], model.dtype)
    ref = ea.expert_attention_math(q.float(), k.float(), v.float(), bias.float())
    out: dict[str, Any] = {"rows": length * spec.num_heads, "keys": length}
    out["sdpa_us"] = round(graph_ms(lambda: layers.attend(q, k, v, bias), reps) * 1000, 2)
    out["sdpa_max_abs_diff"] = max_diff(layers.attend(q, k, v, bias), ref)
    cands = {}
    for block_m, block_n, splits, warps in ea.CANDIDATES:
        opts = {"block_m": block_m, "block_n": block_n, "num_splits": splits, "num_warps": warps}
        name = f"m{block_m}_n{block_n}_s{splits}_w{warps}"
        try:
            cands[name] = {"us": round(graph_ms(lambda: ea.expert_attention_triton(q, k, v, bias, **opts), reps) * 1000, 2),
                           "max_abs_diff": max_diff(ea.expert_attention_triton(q, k, v, bias, **opts), ref)}
        except Exception as exc:  # noqa: BLE001 - a tile this device cannot run
            cands[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    out["triton"] = cands
    out["tuned"] = ea.tuned(q, k, v, bias)
    out["tuned_us"] = round(graph_ms(lambda: ea.expert_attention(q, k, v, bias), reps) * 1000, 2)
    log(f"prefix attention x{batch}: sdpa {out['sdpa_us']} us, tuned triton {out['tuned_us']} us {out['tuned']}")
    return out


def _unfused_vision_layer(x: torch.Tensor, pending: torch.Tensor, w: layers.VisionWeights,
                          nh: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' SigLIP layer as it runs: q, k and v as three matmuls, each element-wise op its own kernel."""
    x = x + pending
    n, t, width = x.shape
    h = F.layer_norm(x, (width,), w.ln1, w.ln1_b, LAYER_NORM_EPS)
    q, k, v = (F.linear(h, wi, bi).view(n, t, nh, -1).transpose(1, 2) for wi, bi in zip(w.qkv.chunk(3), w.qkv_b.chunk(3)))
    x = x + F.linear(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, width), w.o, w.o_b)
    h = F.layer_norm(x, (width,), w.ln2, w.ln2_b, LAYER_NORM_EPS)
    return x, F.linear(F.gelu(F.linear(h, w.fc1, w.fc1_b), approximate="tanh"), w.fc2, w.fc2_b)


def _sdpa_prefix_layer(x, pending, w, kv, cos, sin, bias, nh):
    """``layers.prefix_layer`` with ``scaled_dot_product_attention`` (``layers.attend``) for its attention."""
    x = x + pending
    length = x.shape[1]
    q = layers.project(x, w, kv, 0, cos, sin, nh)
    return layers.finish(x, layers.attend(q, kv[0, :, :length], kv[1, :, :length], bias), w)


def whole_prefix(model: Any, batch: int, fns: dict[str, layers.LayerFns], top: int) -> dict[str, Any]:
    cfg, dev = model.cfg, model.action_in_proj.weight.device
    images = torch.rand(batch, len(cfg.image_features), 3, *cfg.image_resolution, device=dev) * 2 - 1
    tokens = torch.randint(0, 1000, (batch, cfg.tokenizer_max_length), device=dev)
    valid = torch.zeros(batch, cfg.tokenizer_max_length, dtype=torch.bool, device=dev)
    valid[:, :12] = True
    kv = model.kv_buffer(batch, dev)
    present = tuple(range(len(cfg.image_features)))
    out: dict[str, Any] = {}
    for name, f in fns.items():
        def run(f=f) -> None:
            embs, pad = model.embed_prefix(images, present, tokens, valid, f)
            model.prefix_kv(embs, pad, kv, f)
        t0 = time.perf_counter()
        out[f"{name}_ms"] = round(graph_ms(run, 1), 3)
        out[f"{name}_warm_s"] = round(time.perf_counter() - t0, 1)
        if batch == 1:
            out[f"{name}_kernels"] = kernel_table(run, top)
        log(f"whole prefix x{batch}: {name} {out[f'{name}_ms']} ms")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = build_random(full_size(), device=dev, dtype=torch.bfloat16).eval()
    model.fuse()
    res: dict[str, Any] = {"benchmark": "pi0_prefix_profile", "command": " ".join(["python3", "-m",
                           "bench.pi0.profile_prefix", *sys.argv[1:]]), "gpu": torch.cuda.get_device_name(),
                           "torch": torch.__version__, "prefix_tokens": model.cfg.prefix_len, "complete": False}
    compiled = layers.compiled()
    sdpa_prefix = torch.compile(_sdpa_prefix_layer, fullgraph=True, dynamic=None)
    variants = {
        "before": layers.LayerFns(sdpa_prefix, compiled.expert, _unfused_vision_layer, True),
        "vision_compiled": layers.LayerFns(sdpa_prefix, compiled.expert, compiled.vision, True),
        "vision_compiled_triton_attention": compiled,  # the served default
    }
    with torch.inference_mode():
        for b in args.batches:
            res[f"vision_x{b}"] = vision(model, b, compiled, args.reps)
            emit(res, args.out, echo=False)
            res[f"prefix_attention_x{b}"] = prefix_attention(model, b, args.reps)
            emit(res, args.out, echo=False)
        for b in args.batches:
            res[f"whole_prefix_x{b}"] = whole_prefix(model, b, variants, args.top)
            emit(res, args.out, echo=False)
    res["complete"] = True
    emit(res, args.out)


if __name__ == "__main__":
    main()

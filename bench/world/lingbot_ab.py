"""LingBot-World's opt-in shortcuts A/B'd against the exact path in one run (issue 45, goal 2).

    python3 -m bench.world.bench_lingbot --ab --out bench/results/lingbot_ab_h200.json
    python3 -m bench.world.bench_lingbot --ab 'fp8=ffn' 'fp8=all' --ab-chunks 32 --out ...
    python3 -m bench.world.bench_lingbot --ab --tiny --device cpu --out /tmp/ab.json   # CPU test size

One set of random weights (``lingbot_random``), one first image, one seed and one
sequence of held keys; the exact path (4 denoising passes + the committing pass, bf16,
the Wan VAE) runs first, then each variant: the same session from chunk 0 for
``--ab-chunks`` chunks (8) on a pipeline built with the variant's options (the syntax of
the ``lingbot`` entry, ``models/world/lingbot/options.py``; ``decoder=taehv:random``
writes a random state dict in the taew2_1 layout and loads it through the real loader).
Per variant:

* ``chunk_ms`` per chunk (the block: transformer passes and decode, synchronised) and
  its median over the chunks after the KV window is full (``steady``), the transformer
  part alone, and the speed against the exact path's steady chunk;
* ``passes`` per chunk, counted by a forward hook on the transformer;
* the deviation from the exact path: max and mean absolute error of the clean latents
  (normalised, float32) over all chunks, and the PSNR (dB, peak 255) of the decoded
  uint8 frames over all chunks, with both per chunk (drift shows as growth). Equal
  outputs are reported as ``identical`` with PSNR ``null``.

On CUDA the FP8 kernel (``torch._scaled_mm``, rowwise) is also checked against the
emulated path on one FFN layer of the model: the differential test of the fast path.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

DEFAULT_VARIANTS = ("reuse_kv=1", "steps=3", "steps=2", "steps=1", "fp8=ffn", "fp8=attn", "fp8=cross",
                    "fp8=all", "decoder=taehv:random", "steps=1&reuse_kv=1&fp8=ffn&decoder=taehv:random")
RANDOM_TAEHV = "taehv:random"
KEY_CYCLE = ({"w"}, {"w", "d"}, {"l"}, {"w"}, {"i"}, {"a"}, {"w", "j"}, set())


def pairs(query: str) -> list[tuple[str, str]]:
    """``steps=2&fp8=ffn`` -> ``[("steps", "2"), ("fp8", "ffn")]`` (``""``: none)."""
    out = []
    for item in filter(None, query.split("&")):
        k, _, v = item.partition("=")
        out.append((k, v))
    return out


def shortcut_pipeline(comps: Any, query: str, device: torch.device, *, taehv_random: str | None = None,
                      **pipeline_kw: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A pipeline over ``comps`` with the entry options ``query`` applied as the factory
    applies them: (pipeline, the parsed options, the replaced bf16 layers to restore)."""
    from models.world.lingbot.decoders import taehv_decoder, wan_decoder
    from models.world.lingbot.fp8 import quantize_linears
    from models.world.lingbot.options import parse_options
    from models.world.lingbot.pipeline import LingBotPipeline

    if taehv_random is not None:
        query = query.replace(f"decoder={RANDOM_TAEHV}", f"decoder=taehv:{taehv_random}")
    opts = parse_options(pairs(query))
    decoder = taehv_decoder(opts.taehv, device) if opts.taehv else wan_decoder(comps.vae)
    # The bf16 layers wait on the host: bf16 and FP8 weights at once fit no 80 GB card.
    replaced = quantize_linears(comps.transformer, opts.fp8, park="cpu") if opts.fp8 else {}
    pipe = LingBotPipeline(comps, device=device, steps=opts.steps, reuse_kv=opts.reuse_kv, decoder=decoder,
                           **pipeline_kw)
    return pipe, opts, replaced


def random_taehv_file(folder: str) -> str:
    """A random state dict in the exact taew2_1 layout, written where the loader reads it."""
    from models.world.taehv import random_state_dict

    path = Path(folder) / "taew2_1_random.pth"
    torch.save(random_state_dict(seed=0), path)
    return str(path)


def psnr(mse: float) -> float | None:
    return None if mse == 0 else round(10 * math.log10(255.0 ** 2 / mse), 3)


class Rollout:
    """One variant's chunks: latents, frames, times and passes."""

    def __init__(self) -> None:
        self.latents: list[torch.Tensor] = []
        self.frames: list[np.ndarray] = []
        self.chunk_ms: list[float] = []
        self.transformer_ms: list[float] = []
        self.passes: list[int] = []


def rollout(pipe: Any, args: argparse.Namespace, device: torch.device, image: np.ndarray,
            keep_frames: bool = True) -> Rollout:
    from bench.world.bench_lingbot import sync
    from models.world.lingbot.pipeline import BlockRequest

    out = Rollout()
    count = [0]
    hook = pipe.model.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    denoise = pipe._denoise
    spent = [0.0]

    def timed_denoise(*a: Any, **kw: Any) -> torch.Tensor:
        sync(device)
        t = time.perf_counter()
        x0 = denoise(*a, **kw)
        sync(device)
        spent[0] = 1e3 * (time.perf_counter() - t)
        out.latents.append(x0.float().cpu())
        return x0

    pipe._denoise = timed_denoise
    try:
        pipe.open("ab", "a stone cave by the sea", image=image, seed=args.seed)
        for k in range(args.ab_chunks):
            keys = [KEY_CYCLE[(k + i) % len(KEY_CYCLE)] for i in range(pipe.cfg.num_frames_per_block)]
            before = count[0]
            sync(device)
            t = time.perf_counter()
            frames = pipe.generate([BlockRequest("ab", keys=keys)])[0]
            sync(device)
            out.chunk_ms.append(1e3 * (time.perf_counter() - t))
            out.transformer_ms.append(spent[0])
            out.passes.append(count[0] - before)
            if keep_frames:
                out.frames.append(np.asarray(frames))
    finally:
        hook.remove()
        pipe._denoise = denoise
        pipe.close("ab")
    return out


def deviation(ref: Rollout, run: Rollout) -> dict[str, Any]:
    """Latents' max / mean absolute error and the frames' PSNR, over all chunks and per chunk."""
    lat_max, lat_mean, per_psnr, sq, n, abs_sum = [], [], [], 0.0, 0, 0.0
    for a, b, fa, fb in zip(ref.latents, run.latents, ref.frames, run.frames):
        d = (a - b).abs()
        lat_max.append(d.max().item())
        lat_mean.append(d.mean().item())
        abs_sum += float(d.double().sum())
        e = (fa.astype(np.float64) - fb.astype(np.float64)) ** 2
        per_psnr.append(psnr(float(e.mean())))
        sq += float(e.sum())
        n += e.size
    numel = sum(x.numel() for x in ref.latents)
    return {"identical": all(torch.equal(a, b) for a, b in zip(ref.latents, run.latents))
                         and all(np.array_equal(a, b) for a, b in zip(ref.frames, run.frames)),
            "latent_max_abs_err": max(lat_max), "latent_mean_abs_err": abs_sum / numel,
            "frames_psnr_db": psnr(sq / n),
            "per_chunk": {"latent_max_abs_err": [round(x, 6) for x in lat_max],
                          "latent_mean_abs_err": [round(x, 6) for x in lat_mean], "frames_psnr_db": per_psnr},
            "latent_rms_exact": math.sqrt(sum(float((x ** 2).sum()) for x in ref.latents) / numel)}


def steady(xs: list[float], first: int) -> float | None:
    tail = xs[first:] or xs
    return round(statistics.median(tail), 2) if tail else None


def fp8_kernel_check(comps: Any, device: torch.device) -> dict[str, Any] | None:
    """``torch._scaled_mm`` against the emulated FP8 maths on one FFN layer, 4,680 tokens."""
    from bench.world.bench_lingbot import sync
    from models.world.lingbot.fp8 import FP8Linear, scaled_mm_supported

    lin = comps.transformer.blocks[0].ffn[0]
    if not scaled_mm_supported(device, lin.in_features, lin.out_features, lin.weight.dtype):
        return None
    fast, slow = FP8Linear.from_linear(lin, "scaled_mm"), FP8Linear.from_linear(lin, "emulated")
    x = torch.randn(1, 4680, lin.in_features, device=device, dtype=lin.weight.dtype)
    yf, ys, yr = fast(x).float(), slow(x).float(), lin(x).float()

    def ms(fn: Any) -> float:
        for _ in range(3):
            fn(x)
        sync(device)
        t = time.perf_counter()
        for _ in range(20):
            fn(x)
        sync(device)
        return round(1e3 * (time.perf_counter() - t) / 20, 4)

    return {"layer": "blocks.0.ffn.0", "tokens": 4680, "shape": [lin.out_features, lin.in_features],
            "scaled_mm_vs_emulated_max_abs": (yf - ys).abs().max().item(),
            "scaled_mm_vs_emulated_rel": ((yf - ys).norm() / ys.norm()).item(),
            "fp8_vs_bf16_rel": ((yf - yr).norm() / yr.norm()).item(),
            "bf16_ms": ms(lin), "scaled_mm_ms": ms(fast), "emulated_ms": ms(slow)}


def run_ab(args: argparse.Namespace, device: torch.device,
           progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every variant of ``args.ab`` against the exact path; the JSON's ``ab`` section, also
    handed to ``progress`` after each variant (a variant that fails is recorded in ``errors``)."""
    from bench.world.bench_lingbot import log, memory
    from bench.world.lingbot_random import random_components

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    vae_dtype = getattr(torch, args.vae_dtype) if cuda else torch.float32
    comps = random_components(device, dtype=dtype, vae_dtype=vae_dtype, tiny=args.tiny, seed=args.seed)
    image = np.random.default_rng(args.seed).integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
    kw = dict(height=args.height, width=args.width, max_sessions=1)
    if getattr(args, "condition_latents", None) is not None:
        kw["condition_latents"] = args.condition_latents
    cfg = comps.transformer.config
    window_blocks = (cfg.sink_size + cfg.rolling_frames) // cfg.num_frames_per_block
    out: dict[str, Any] = {
        "chunks": args.ab_chunks, "seed": args.seed, "steady_from_chunk": window_blocks,
        "reference": "exact: 4 denoising passes + the committing pass, the Wan VAE, " + str(dtype),
        "variants": {}, "errors": {}}
    tmp = tempfile.TemporaryDirectory()
    taehv_file = random_taehv_file(tmp.name) if any(RANDOM_TAEHV in v for v in args.ab) else None
    try:
        if cuda:
            try:   # the FP8 kernel against its emulation first: a fast path checked before it is timed
                out["fp8_kernel_check"] = fp8_kernel_check(comps, device)
            except Exception as e:  # noqa: BLE001 - recorded; the emulated path still runs
                traceback.print_exc()
                out["errors"]["fp8_kernel_check"] = f"{type(e).__name__}: {e}"
            if args.ab_warmup:
                pipe, _, _ = shortcut_pipeline(comps, "", device, **kw)
                rollout(pipe, argparse.Namespace(**{**vars(args), "ab_chunks": args.ab_warmup}), device, image,
                        keep_frames=False)
                del pipe
                release(device)
        ref = None
        for query in ("", *args.ab):
            name = query or "exact"
            log(f"ab {name} ...")
            try:
                row, run = measure(comps, query, device, args, image, taehv_file, window_blocks, kw)
            except Exception as e:
                if ref is None:
                    raise   # no reference, no comparison
                traceback.print_exc()
                out["errors"][name] = f"{type(e).__name__}: {e}"
                continue
            if ref is None:
                ref = run
            else:
                row.update(deviation(ref, run))
                base = out["variants"]["exact"]
                if base["steady_chunk_ms"] and row["steady_chunk_ms"]:
                    row["speed_vs_exact"] = round(base["steady_chunk_ms"] / row["steady_chunk_ms"], 3)
            out["variants"][name] = row
            log(f"ab {name}: steady chunk {row['steady_chunk_ms']} ms, passes {row['passes_per_chunk']}, "
                f"latent max err {row.get('latent_max_abs_err')}, psnr {row.get('frames_psnr_db')}")
            if progress is not None:
                progress(out)
        out["memory_end"] = memory(device)
    finally:
        tmp.cleanup()
    return out


def measure(comps: Any, query: str, device: torch.device, args: argparse.Namespace, image: np.ndarray,
            taehv_file: str | None, window_blocks: int, kw: dict[str, Any]) -> tuple[dict[str, Any], Rollout]:
    """One variant's rollout and its row; the model is given back as it was (bf16 layers)."""
    from bench.world.bench_lingbot import sync
    from models.world.lingbot.fp8 import fp8_summary, restore_linears

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    pipe, opts, replaced = shortcut_pipeline(comps, query, device, taehv_random=taehv_file, **kw)
    try:
        run = rollout(pipe, args, device, image)
        row: dict[str, Any] = {
            "options": opts.query(), "passes_per_chunk": pipe.passes_per_block, "passes": run.passes,
            "decoder": pipe.block_decoder.name, "fp8": fp8_summary(pipe.model) if opts.fp8 else None,
            "chunk_ms": [round(x, 2) for x in run.chunk_ms],
            "transformer_ms": [round(x, 2) for x in run.transformer_ms],
            "steady_chunk_ms": steady(run.chunk_ms, window_blocks),
            "steady_transformer_ms": steady(run.transformer_ms, window_blocks)}
        if cuda:
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    finally:
        del pipe
        restore_linears(comps.transformer, replaced, device)
        if cuda:
            sync(device)
        release(device)
    return row, run


def release(device: torch.device) -> None:
    """Give a dropped pipeline's memory back before the next is built (its KV pool is a
    third of the card; the pipeline's reference cycles hold it until a collection)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

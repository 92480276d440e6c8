#!/usr/bin/env python3
"""Wan VAE decode on the GPU: diffusers' one-shot ``decode`` vs the streaming decoder, one run.

    python3 -m bench.world.bench_wan_vae --out bench/results/wan_vae_decode_h200.json   # H200
    python3 -m bench.world.bench_wan_vae --device cpu --height 32 --width 48 --frames 2 3 \
        --out /tmp/wan_vae_smoke.json                                                    # smoke test

The default ``AutoencoderKLWan`` config (Wan 2.1, 127 M parameters, random weights) in
bf16 decodes 1 x 16 x T x 60 x 104 latents to 480 x 832 video, T in ``--frames``.
Streaming variants (``models/world/wan_vae.py``) decode the same latents in blocks of
``--block`` latent frames on one state, new state included in the time; ``graph``
replays the per-latent-frame step as a CUDA graph (the state is reset, not rebuilt,
between repetitions, so its graph is kept), ``channels_last`` runs channels-last
convolutions with in-conv padding (on a copy of the VAE). Reported per variant and T:
ms per output frame (best of ``--reps`` after a warm-up), the marginal ms per output
frame between the smallest and largest T, time to the first frame of a steady block,
max |streaming - one-shot|, the state's bytes, a CUDA swap round trip (bit-exact?) and
the memory high-water mark. The JSON is rewritten after every measurement.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from models.world.wan_vae import StreamingWanDecoder  # noqa: E402

VARIANTS = {  # name: (cuda_graph, channels_last)
    "eager": (False, False),
    "graph": (True, False),
    "channels_last": (False, True),
    "graph_channels_last": (True, True),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> tuple[float, object]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _env(device: torch.device) -> dict:
    import diffusers

    env = {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
           "host": platform.node(), "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), sm_count=p.multi_processor_count)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--frames", type=int, nargs="+", default=[3, 9, 21])
    ap.add_argument("--block", type=int, default=3, help="latent frames per streaming block (a tick)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip what would start after this")
    args = ap.parse_args()

    from diffusers import AutoencoderKLWan

    start = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    torch.backends.cudnn.benchmark = True
    result: dict = {"command": " ".join([os.path.basename(sys.executable), "-m", "bench.world.bench_wan_vae",
                                         *sys.argv[1:]]),
                    "env": _env(device), "config": "AutoencoderKLWan() defaults (Wan 2.1), random weights",
                    "dtype": "bfloat16", "height": args.height, "width": args.width, "block": args.block,
                    "issue_anchor_one_shot_ms_per_frame": 22.4, "goal": "streaming ms/frame <= one-shot, aim 0.5x",
                    "one_shot": {}, "streaming": {}, "errors": {}}

    def save() -> None:
        result["elapsed_s"] = round(time.perf_counter() - start, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    torch.manual_seed(0)
    with torch.device(device):
        vae = AutoencoderKLWan().to(dtype).eval()
    result["decoder_params"] = sum(p.numel() for p in vae.decoder.parameters())
    lh, lw = args.height // 8, args.width // 8
    zs = {t: torch.randn(1, 16, t, lh, lw, device=device, dtype=dtype) for t in args.frames}
    refs = {}
    print(f"vae ready in {time.perf_counter() - start:.1f}s; latents {lh}x{lw}, frames {args.frames}", flush=True)

    # -- diffusers one-shot ----------------------------------------------------------------
    with torch.no_grad():
        vae.decode(zs[args.frames[0]])  # warm-up: cuDNN picks algorithms for every shape
        for t in args.frames:
            times = []
            for _ in range(args.reps):
                dt, out = _timed(lambda: vae.decode(zs[t]).sample, device)
                times.append(dt)
            refs[t] = out
            n = out.shape[2]
            result["one_shot"][str(t)] = {"output_frames": n, "ms_total": round(1e3 * min(times), 2),
                                         "ms_per_frame": round(1e3 * min(times) / n, 3),
                                         "all_ms": [round(1e3 * x, 2) for x in times]}
            print(f"one-shot T={t}: {1e3 * min(times) / n:.2f} ms/frame", flush=True)
            save()
    _marginal(result["one_shot"], args.frames)
    save()

    # -- streaming ---------------------------------------------------------------------------
    for name in args.variants:
        if time.perf_counter() - start > args.budget_s:
            result["errors"][name] = "skipped: time budget"
            continue
        graph, cl = VARIANTS[name]
        try:
            model = copy.deepcopy(vae) if cl else vae
            dec = StreamingWanDecoder(model, cuda_graph=graph and device.type == "cuda", channels_last=cl)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            row: dict = {"cuda_graph": graph, "channels_last": cl, "frames": {}}
            state = dec.new_state(1, lh, lw)

            def run(t: int) -> torch.Tensor:
                state.reset()
                outs = [dec.decode(state, zs[t][:, :, a : a + args.block]) for a in range(0, t, args.block)]
                return torch.cat(outs, dim=2)

            dt, _ = _timed(lambda: run(args.frames[0]), device)  # warm-up (and the graph capture)
            row["warmup_s"] = round(dt, 2)
            for t in args.frames:
                times = []
                for _ in range(args.reps):
                    dt, out = _timed(lambda: run(t), device)
                    times.append(dt)
                n = out.shape[2]
                err = (out.float() - refs[t].float()).abs()
                row["frames"][str(t)] = {"output_frames": n, "ms_total": round(1e3 * min(times), 2),
                                         "ms_per_frame": round(1e3 * min(times) / n, 3),
                                         "vs_one_shot": round(result["one_shot"][str(t)]["ms_total"]
                                                              / (1e3 * min(times)), 3),
                                         "max_abs_diff": err.max().item(), "mean_abs_diff": err.mean().item(),
                                         "bit_equal": bool(torch.equal(out, refs[t]))}
                print(f"{name} T={t}: {1e3 * min(times) / n:.2f} ms/frame, max diff {err.max().item():.4f}",
                      flush=True)
                save()
            _marginal(row["frames"], args.frames)
            # First frame of a steady block: the block after one already decoded.
            state.reset()
            dec.decode(state, zs[args.frames[-1]][:, :, : args.block])
            gen = dec.frames(state, zs[args.frames[-1]][:, :, args.block : 2 * args.block])
            dt, _ = _timed(lambda: next(gen), device)
            dt_rest, _ = _timed(lambda: list(gen), device)
            row["steady_block_first_frame_ms"] = round(1e3 * dt, 2)
            row["steady_block_ms"] = round(1e3 * (dt + dt_rest), 2)
            row["state_bytes"] = state.nbytes
            row["state_mib"] = round(state.nbytes / 2**20, 1)
            if device.type == "cuda":
                before = [c.clone() for c in state.caches]
                t_out, _ = _timed(state.to_host, device)
                t_in, _ = _timed(lambda: state.to_device(device), device)
                row["swap"] = {"out_ms": round(1e3 * t_out, 2), "in_ms": round(1e3 * t_in, 2),
                               "bit_exact": all(torch.equal(a, b) for a, b in zip(state.caches, before)),
                               "note": "first swap-out also pins the host buffers"}
                del before
                row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            state.free()
            result["streaming"][name] = row
            del dec, model
        except Exception as e:  # keep the other variants' figures
            result["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        save()
    print(json.dumps({k: result[k] for k in ("one_shot", "errors")}, indent=1))
    save()


def _marginal(rows: dict, frames: list[int]) -> None:
    lo, hi = str(min(frames)), str(max(frames))
    if lo != hi and lo in rows and hi in rows:
        dn = rows[hi]["output_frames"] - rows[lo]["output_frames"]
        rows["marginal_ms_per_frame"] = round((rows[hi]["ms_total"] - rows[lo]["ms_total"]) / dn, 3)


if __name__ == "__main__":
    main()

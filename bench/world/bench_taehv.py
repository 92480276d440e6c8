#!/usr/bin/env python3
"""TAEHV decode (the taew2_1 decoder, random weights at full size) of 12-frame chunks on one device.

    python3 -m bench.world.bench_taehv --device cuda --out bench/results/taehv_decode_h100.json
    python3 -m bench.world.bench_taehv --device cpu --tiny --out /tmp/taehv_smoke.json   # seconds

The decoder's widths are fixed by the public architecture, so it is always full size (9.8 M
parameters): random tensors in the exact taew2_1 layout are written to a temporary file and
read back through ``load_taehv`` (the load is timed too), in ``--dtype`` (float16 on CUDA, as
the reference runs; float32 on CPU). One session state decodes ``--chunks`` blocks of 3 latent
frames at ``--height`` x ``--width`` (480 x 832; ``--tiny``: 16 x 16, 2 chunks, 1 repetition):
the first block gives 9 frames, every later one 12. Per variant (``eager``; ``channels_last``:
the weights channels-last, the same code) and per repetition on a reset state:
``decode`` (a block in one pass) ms per steady chunk and per frame, and ``frames`` (one latent
frame at a time) ms to a steady chunk's first frame and to its last; max |frames - decode|,
the state's bytes, the device's memory high-water mark. The JSON is rewritten after each variant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from models.world.taehv import TAEHVDecoder, load_taehv, random_state_dict  # noqa: E402

BLOCK = 3   # latent frames per block (a LingBot tick): 12 output frames
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _env(device: torch.device) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env


def time_chunks(dec: TAEHVDecoder, z: torch.Tensor, reps: int, device: torch.device) -> dict:
    """Decode ``z`` block by block on one state, ``reps`` times from a reset state, both ways."""
    lh, lw = z.shape[3:]
    state = dec.new_state(1, lh, lw, device)
    blocks = [z[:, :, a:a + BLOCK] for a in range(0, z.shape[2], BLOCK)]
    first_ms, steady_ms, first_frame_ms, frames_chunk_ms, frames_first_block_ms = [], [], [], [], []
    max_diff = 0.0
    counts: list[int] = []
    for _ in range(reps):
        state.reset()
        outs = []
        for k, block in enumerate(blocks):
            _sync(device)
            t0 = time.perf_counter()
            out = dec.decode(state, block)
            _sync(device)
            (first_ms if k == 0 else steady_ms).append(1e3 * (time.perf_counter() - t0))
            outs.append(out)
        counts = [o.shape[2] for o in outs]
        state.reset()
        for k, (block, ref) in enumerate(zip(blocks, outs)):
            _sync(device)
            t0 = time.perf_counter()
            gen = dec.frames(state, block)
            got = [next(gen)]
            _sync(device)
            t1 = time.perf_counter()
            got += list(gen)
            _sync(device)
            t2 = time.perf_counter()
            if k == 0:
                frames_first_block_ms.append(1e3 * (t2 - t0))
            else:
                first_frame_ms.append(1e3 * (t1 - t0))
                frames_chunk_ms.append(1e3 * (t2 - t0))
            max_diff = max(max_diff, (torch.stack(got, 2).float() - ref.float()).abs().max().item())
    state_bytes = state.nbytes
    state.free()
    steady = min(steady_ms) if steady_ms else None
    return {
        "output_frames_per_block": counts,
        "decode": {"first_block_ms": round(min(first_ms), 3),
                   "steady_chunk_ms": None if steady is None else round(steady, 3),
                   "steady_chunk_ms_median": round(statistics.median(steady_ms), 3) if steady_ms else None,
                   "steady_ms_per_frame": None if steady is None else round(steady / (4 * BLOCK), 3),
                   "all_steady_ms": [round(x, 3) for x in steady_ms]},
        "frames": {"first_block_ms": round(min(frames_first_block_ms), 3),
                   "steady_first_frame_ms": round(min(first_frame_ms), 3) if first_frame_ms else None,
                   "steady_chunk_ms": round(min(frames_chunk_ms), 3) if frames_chunk_ms else None},
        "max_abs_diff_frames_vs_decode": max_diff,
        "state_bytes": state_bytes,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="16 x 16, 2 chunks, 1 repetition (CPU smoke run)")
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--chunks", type=int, default=6, help="blocks of 3 latent frames per session run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=list(DTYPES), default=None, help="float16 on CUDA, float32 elsewhere")
    ap.add_argument("--variants", nargs="+", default=["eager", "channels_last"])
    args = ap.parse_args(argv)
    if args.tiny:
        args.height, args.width, args.chunks, args.reps = 16, 16, 2, 1

    start = time.perf_counter()
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("float16" if device.type == "cuda" else "float32")]
    torch.backends.cudnn.benchmark = True
    lh, lw = args.height // 8, args.width // 8
    result: dict = {"command": " ".join(["python3", "-m", "bench.world.bench_taehv", *(argv or sys.argv[1:])]),
                    "env": _env(device), "weights": "random, exact taew2_1 layout (fp16 file)",
                    "dtype": str(dtype).removeprefix("torch."), "height": args.height, "width": args.width,
                    "latent": [lh, lw], "block_latent_frames": BLOCK, "chunks": args.chunks, "reps": args.reps,
                    "variants": {}, "errors": {}}

    def save() -> None:
        result["elapsed_s"] = round(time.perf_counter() - start, 2)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "taew2_1.pth")
        torch.save(random_state_dict(seed=0), path)
        t0 = time.perf_counter()
        dec = load_taehv(path, device=device, dtype=dtype)
        _sync(device)
        result["load_ms"] = round(1e3 * (time.perf_counter() - t0), 1)
    result["decoder_params"] = sum(p.numel() for p in dec.parameters())
    result["state_bytes_per_session"] = dec.state_bytes(1, lh, lw)
    torch.manual_seed(0)
    z = torch.randn(1, 16, BLOCK * args.chunks, lh, lw, device=device)
    save()

    for name in args.variants:
        try:
            if name == "channels_last":   # the convolutions' outputs follow their weights' format
                dec = dec.to(memory_format=torch.channels_last)
            elif name != "eager":
                raise ValueError(f"unknown variant {name!r}")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            time_chunks(dec, z[:, :, :2 * BLOCK], 1, device)   # warm-up (cuDNN picks algorithms)
            row = time_chunks(dec, z, args.reps, device)
            if device.type == "cuda":
                row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
            result["variants"][name] = row
            print(f"{name}: steady chunk {row['decode']['steady_chunk_ms']} ms (decode), first frame "
                  f"{row['frames']['steady_first_frame_ms']} ms (frames)", flush=True)
        except Exception as e:  # keep the other variants' figures
            result["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        save()
    save()
    return result


if __name__ == "__main__":
    main()

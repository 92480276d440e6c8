#!/usr/bin/env python3
"""LingBot-World at full geometry on one GPU, served vs bare, in one run (issue 16, "GPU figures").

    python3 -m bench.world.bench_lingbot --out bench/results/lingbot_h200.json        # H200, ~5 min
    python3 -m bench.world.bench_lingbot --tiny --device cpu --out /tmp/lingbot.json  # CPU smoke test
    python3 -m bench.world.bench_lingbot --options 'steps=1&reuse_kv=1' --out ...   # with shortcuts
    python3 -m bench.world.bench_lingbot --ab --out bench/results/lingbot_ab_h200.json  # A/B mode

``--options`` builds the model with the ``lingbot`` entry's shortcuts (the serve syntax,
``models/world/lingbot/options.py``). ``--ab`` runs only the A/B mode instead of the
sections below: each shortcut against the exact path in one run (``lingbot_ab.py``).

The 14B transformer (40 layers, 40 heads x 128), the default Wan VAE and a 1-layer text
encoder are built with random weights directly on the device (``lingbot_random.py``;
bf16 transformer, VAE in ``--vae-dtype``: float32 is what ``realtime serve`` loads) at
480 x 832: 1,560 tokens per latent frame, blocks of 3 frames (4,680 query tokens), sink
9 + 6 rolling frames. The pool is sized for ``--pool-sessions`` (2) resident sessions.
Sections (``--only`` picks some; each rewrites the JSON when it ends and is skipped when
it would start after ``--budget-s``), in the order they run but ``attention``, which runs last:

``attention``  one layer at 4,680 queries over 37,440 cached keys (the issue's anchor) and
               over 23,400 (this model's sink + rolling window), plus the block's own keys:
               the committing pass's paged path (``kv.paged_attention``, every backend and
               the auto choice) and the denoising passes' path (``BlockKV._transient``:
               gather + concat + SDPA) vs SDPA on the same K/V laid out contiguously, and
               SDPA on a view of the pool (the ceiling of one block-id run per row).
``bare``       ``adapter.run_batch`` + ``end_tick`` of one session, the call the engine
               makes, on a thread of its own like the engine's, after ``--warmup-ticks`` (6:
               the sink and window are full and the shape steady), ``--ticks`` timed; each
               split into transformer passes and the VAE block decode.
``served``     a real uvicorn server on loopback (realtime.server.server.serve_in_thread) with the
               engine, and a real websockets client in this process speaking world.v1 (rgb8,
               a PNG first image, credits kept 2 ahead): the chunk period vs the bare tick.
``ttff``       key press to first decoded frame: an idle session (no credit) gets an event
               and one credit; and a streaming session gets an event at a random moment of a
               tick. Beside it the tick's parts (transformer passes, VAE block decode, the
               decode's first frame). Session A gets whole chunks; session B (created for
               ``sessions``) uses world.v1 ``stream_frames``, each frame sent as decoded.
``sessions``   two resident sessions ticking at once (the engine alternates them).
``swap``       three sessions on the pool for two: every tick swaps one in and one out;
               swap time and bytes beside pinned host<->device copy bandwidth.
``kv``         a steady session's KV bytes (held blocks measured from the pool tensors,
               cross slot, decode state) vs ``kv.capacity.session_bytes``, to the byte.

Every tick records its phases (the device is synchronised at the block's start and
around the decode, whose ``.cpu()`` synchronises anyway), its swap time and its GPU
memory high-water mark. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import resource
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import numpy as np
import torch

from bench.report import emit
from bench.machine import GIB, machine
from bench.timing import med, sync
from bench.world import harness
from bench.sections import Sections
from bench.world.harness import BenchArguments, WorldStream, first_image, serving
from bench.world.lingbot_ab import DEFAULT_VARIANTS
from realtime.server.inventory import on_spent_thread

SECTIONS = ("attention", "bare", "served", "ttff", "sessions", "swap", "kv")
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_lingbot {time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ environment
def environment(device: torch.device) -> dict[str, Any]:
    import diffusers
    import transformers

    env = {**machine(device), "torch": torch.__version__, "diffusers": diffusers.__version__,
           "transformers": transformers.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def memory(device: torch.device) -> dict[str, Any]:
    """Device allocator figures now, the process's host memory, and pinned host memory."""
    out: dict[str, Any] = {}
    status = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    status[k] = int(v.split()[0]) * 1024
    except OSError:
        status["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["host_rss_bytes"] = status.get("VmRSS")
    out["host_rss_peak_bytes"] = status.get("VmHWM")
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out.update(allocated_bytes=torch.cuda.memory_allocated(device),
                   reserved_bytes=torch.cuda.memory_reserved(device),
                   peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
                   device_used_bytes=total - free, device_free_bytes=free)
        try:
            hs = torch.cuda.host_memory_stats()
            out["pinned_host_allocated_bytes"] = hs.get("allocated_bytes.current")
            out["pinned_host_reserved_bytes"] = hs.get("reserved_bytes.current")
            out["pinned_host_peak_bytes"] = hs.get("allocated_bytes.peak")
        except (AttributeError, RuntimeError):
            pass
    return out


# ------------------------------------------------------------------ per-tick phases
class TickClock(harness.TickClock):
    """The shared per-tick clock (``bench.world.harness.TickClock``) with what kv residency did
    during the tick (the swaps, their bytes and seconds, the host bytes held, the resident and
    open sessions) and the transformer passes: block start to the first decode, less the swap."""

    def finish(self, tick: dict[str, Any], m0: dict[str, Any], m1: dict[str, Any], decode_start: float) -> None:
        tick.update(transformer_ms=1e3 * (decode_start - tick["t_start"]) - tick["swap_ms"],
                    swap_ins=m1["swap_ins"] - m0["swap_ins"], swap_outs=m1["swap_outs"] - m0["swap_outs"],
                    swap_in_bytes=m1["swap_in_bytes"] - m0["swap_in_bytes"],
                    swap_out_bytes=m1["swap_out_bytes"] - m0["swap_out_bytes"],
                    swap_in_s=m1["swap_in_seconds"] - m0["swap_in_seconds"],
                    swap_out_s=m1["swap_out_seconds"] - m0["swap_out_seconds"],
                    host_bytes=m1["host_bytes"], resident=m1["resident_sessions"],
                    open_sessions=len(self.pipeline.sessions))


def phase_summary(ticks: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("total_ms", "transformer_ms", "decode_ms", "first_frame_ms", "swap_ms")
    out: dict[str, Any] = {f"{k}_median": med([t[k] for t in ticks if t.get(k) is not None]) for k in keys}
    out["n"] = len(ticks)
    if ticks and "peak_allocated_bytes" in ticks[0]:
        out["peak_allocated_bytes_max"] = max(t["peak_allocated_bytes"] for t in ticks)
    return out


# ------------------------------------------------------------------ build
def build(args: argparse.Namespace, device: torch.device) -> tuple[Any, dict[str, Any]]:
    from bench.world.lingbot_ab import random_taehv_file, shortcut_pipeline
    from bench.world.lingbot_random import parameter_bytes, random_components
    from models.world.lingbot.adapter import LingBotWorld

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    vae_dtype = getattr(torch, args.vae_dtype) if cuda else torch.float32
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    comps = random_components(device, dtype=dtype, vae_dtype=vae_dtype, tiny=args.tiny)
    sync(device)
    built_s = time.perf_counter() - t0
    mem_weights = memory(device)
    extra = {} if getattr(args, "condition_latents", None) is None else {"condition_latents": args.condition_latents}
    taehv = random_taehv_file(args.scratch) if "taehv:random" in args.options else None
    pipeline, shortcuts, _ = shortcut_pipeline(comps, args.options, device, taehv_random=taehv, height=args.height,
                                               width=args.width, max_sessions=args.pool_sessions, **extra)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    adapter = LingBotWorld(pipeline, max_batch=args.max_batch, shortcuts=shortcuts)
    sync(device)
    cfg = pipeline.cfg
    info = {
        "build_s": round(built_s, 2), "pipeline_s": round(time.perf_counter() - t0 - built_s, 2),
        "transformer_config": cfg.to_config(), "dtype": str(dtype), "vae_dtype": str(vae_dtype),
        "transformer_params": sum(p.numel() for p in comps.transformer.parameters()),
        "transformer_bytes": parameter_bytes(comps.transformer) + buffer_bytes(comps.transformer),
        "vae_bytes": parameter_bytes(comps.vae),
        "text_encoder_bytes": parameter_bytes(comps.text_encoder),
        "height": args.height, "width": args.width, "latent_hw": list(pipeline.latent_hw),
        "tokens_per_frame": pipeline.geometry.tokens_per_frame,
        "query_tokens_per_block": pipeline.geometry.tokens_per_frame * cfg.num_frames_per_block,
        "denoising_steps": len(pipeline.sigmas), "passes_per_tick": pipeline.passes_per_block,
        "shortcuts": shortcuts.query() or None,
        "shortcuts_note": ("the exact path: the model's own 4 DMD steps + the committing pass" if shortcuts.exact
                           else f"with the shortcuts {shortcuts.query()!r} (--options)"),
        "pool_sessions": args.pool_sessions, "pool_blocks": pipeline.cache.pool.num_blocks,
        "pool_bytes": pipeline.cache.storage.nbytes(), "max_batch": args.max_batch,
        "memory_after_weights": mem_weights, "memory_after_pool": memory(device),
        "random_weights": "transformer at full size; 1-layer UMT5 at text_dim (runs only at open); "
                          "Wan VAE " + ("tiny" if args.tiny else "default (Wan 2.1) config"),
    }
    return adapter, info


def capacity_plan(adapter: Any, device: torch.device) -> dict[str, Any]:
    """What the factory's ``build`` would size the pool to at the device's free memory now."""
    from kv import plan_capacity
    from kv.capacity import required_bytes, session_bytes

    g = adapter.pipeline.geometry
    out: dict[str, Any] = {"page_bytes": g.page_bytes, "cross_bytes": g.cross_bytes,
                           "model_state_bytes": g.model_state_bytes, "session_bytes": session_bytes(g),
                           "required_1_bytes": required_bytes(g, 1), "required_2_bytes": required_bytes(g, 2)}
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        plan = plan_capacity(g, available_bytes=free + adapter.pipeline.cache.storage.nbytes(), fraction=0.9)
        out.update(free_plus_pool_bytes=free + adapter.pipeline.cache.storage.nbytes(),
                   sessions_at_fraction_0_9=plan.capacity)
    return out


# ------------------------------------------------------------------ attention
def attention(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import torch.nn.functional as F

    from bench.kv.bench_kv import LINGBOT, attention_case, time_ms
    from kv.triton_paged import triton_available
    from models.world.lingbot.attention import BlockKV

    if args.tiny:
        base = dataclasses.replace(LINGBOT, kv_heads=2, head_dim=16, tokens_per_frame=60, block_size=60,
                                   num_layers=1)
    else:
        base = LINGBOT
    cases = {"issue_37440_keys": dataclasses.replace(base, window_frames=15),
             "model_23400_keys": dataclasses.replace(base, window_frames=6)}
    backends = ["gather_sdpa"] + (["gather_flash", "gather_cudnn"] if device.type == "cuda" else [])
    if device.type == "cuda" and triton_available():
        backends.append("triton")
    out: dict[str, Any] = {"backends": backends, "goal": "paged >= 0.98x contiguous SDPA"}
    for name, g in cases.items():
        log(f"attention {name}: paged backends {backends} ...")
        res = attention_case(g, 1, device, backends=backends)
        # The denoising passes' path: held pages gathered, the block's K/V concatenated, SDPA.
        from kv.cache import PagedKVCache
        from kv.capacity import pool_blocks

        g1 = dataclasses.replace(g, num_layers=1)
        c = PagedKVCache(g1, pool_blocks(g1, 1, 1) + 1, device, max_sessions=1, attention_backend="gather_sdpa")
        c.open("s")
        for _ in range((g.sink_frames + g.window_frames) // g.frames_per_tick):
            c.commit_batch(c.begin_batch(["s"]))
        c.storage.k[0].normal_()
        c.storage.v[0].normal_()
        batch = c.begin_batch(["s"])
        lq, H, D = g.frames_per_tick * g.tokens_per_frame, g.kv_heads, g.head_dim
        q, k, v = (torch.randn(1, lq, H, D, device=device, dtype=g.dtype) for _ in range(3))
        kv = BlockKV(c, batch)
        held = batch.num_pages[0] - batch.chunk_pages
        idx = batch.block_tables[0, :held].long()
        kc = torch.cat([c.storage.k[0].index_select(0, idx).view(1, -1, H, D), k], 1).contiguous()
        vc = torch.cat([c.storage.v[0].index_select(0, idx).view(1, -1, H, D), v], 1).contiguous()
        contiguous = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2),  # noqa: E731
                                                            vc.transpose(1, 2))
        transient = lambda: kv._transient(0, q, k, v)  # noqa: E731
        # The ceiling of a layout where a row's pages are one run of block ids: SDPA straight
        # on a view of the pool (no gather; attention is permutation-invariant over pages).
        n = batch.num_pages[0]
        kp = c.storage.k[0][:n].view(1, n * g.block_size, H, D)
        vp = c.storage.v[0][:n].view(1, n * g.block_size, H, D)
        pool_view = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), kp.transpose(1, 2),  # noqa: E731
                                                           vp.transpose(1, 2))
        ref = contiguous().transpose(1, 2)
        err = ((transient().float() - ref.float()).norm() / ref.float().norm()).item()
        t_c, t_t, t_v = time_ms(contiguous, device), time_ms(transient, device), time_ms(pool_view, device)
        res["transient_path"] = {"keys": kc.shape[1], "contiguous_sdpa_ms": t_c, "transient_ms": t_t,
                                 "speed_vs_sdpa": round(t_c / t_t, 4), "rel_err_vs_contiguous": err}
        res["pool_view_sdpa"] = {"keys": kp.shape[1], "ms": t_v, "speed_vs_sdpa": round(t_c / t_v, 4),
                                 "note": "SDPA on a view of pool blocks 0..n-1: what one contiguous run "
                                         "of block ids per row would give"}
        out[name] = res
        log(f"attention {name}: contiguous {res['contiguous_sdpa_default_ms']:.3f} ms, paged auto "
            f"{res['times_ms']['auto']:.3f} ms ({res['speed_vs_sdpa']}x), transient {t_t:.3f} ms "
            f"({t_c / t_t:.3f}x)")
        del c, q, k, v, kc, vc, kp, vp, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------ bare
def bare(adapter: Any, clock: TickClock, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from models.world.base import WorldTick

    F = adapter.geometry.frames_per_chunk
    sid = "bare"
    sync(device)
    t0 = time.perf_counter()
    adapter.pipeline.open(sid, "a stone cave", image=None, seed=1)
    sync(device)
    open_s = time.perf_counter() - t0
    times, first = [], clock.count()
    for k in range(args.warmup_ticks + args.ticks):
        work = WorldTick(sid, f"{sid}:{k}", k, (), None, tuple(frozenset({"w"}) for _ in range(F)), seed=1)
        sync(device)
        t = time.perf_counter()
        chunk = adapter.run_batch([work])[0]
        adapter.end_tick(sid, True)
        sync(device)
        ms = 1e3 * (time.perf_counter() - t)
        log(f"bare tick {k}: {ms:.1f} ms" + (" (warm-up)" if k < args.warmup_ticks else ""))
        if k >= args.warmup_ticks:
            times.append(ms)
    ticks = clock.since(first)[args.warmup_ticks:]
    frames_ok = bool(np.isfinite(chunk.frames).all()) and chunk.frames.std() > 0
    out = {"open_ms": round(1e3 * open_s, 1), "tick_ms": [round(x, 2) for x in times], "tick_ms_median": med(times),
           "phases": phase_summary(ticks), "frames_vary": bool(frames_ok),
           "held_pages_at_end": len(adapter.pipeline.cache.table(sid).held)}
    cfg = adapter.pipeline.cfg
    passes = adapter.pipeline.passes_per_block
    if out["phases"]["transformer_ms_median"]:
        out["ms_per_layer_pass"] = round(out["phases"]["transformer_ms_median"] / (cfg.num_layers * passes), 3)
    adapter.drop_session(sid)
    return out


# ------------------------------------------------------------------ a world.v1 client
@dataclasses.dataclass
class ChunkArrival:
    header: dict[str, Any]
    t_header: float
    t_first: float | None = None
    t_last: float | None = None
    frames: list[bytes] = dataclasses.field(default_factory=list, repr=False)


class Stream(WorldStream):
    """One world.v1 session on its own websocket; a reader task timestamps every chunk's
    header and frames as they arrive."""

    def __init__(self, ws: Any, sid: str) -> None:
        self.stream_frames = False
        self._partial: dict[str, ChunkArrival] = {}   # streamed frames of chunks not committed yet
        self.received = 0
        super().__init__(ws, sid)

    @classmethod
    async def open(cls, url: str, sid: str, image: bytes | None, credits: int, seed: int,
                   stream_frames: bool = False) -> "Stream":
        s = await cls.create(url, sid, image, model="lingbot", prompt="a stone cave", seed=seed, format="rgb8",
                             credits=credits, stream_frames=stream_frames)
        s.stream_frames = stream_frames
        return s

    async def _read(self) -> None:
        import websockets

        try:
            while True:
                msg = await self.ws.recv()
                now = time.perf_counter()
                if isinstance(msg, bytes):
                    raise RuntimeError("binary frame outside a chunk")
                data = json.loads(msg)
                kind = data.get("type")
                if kind == "chunk.frames":   # stream_frames: frames before their commit
                    part = self._partial.setdefault(data["request_id"], ChunkArrival(data, now))
                    for _ in range(data["frames"]):
                        part.frames.append(await self.ws.recv())
                        part.t_first = part.t_first or time.perf_counter()
                    part.t_last = time.perf_counter()
                    continue
                if kind != "chunk":
                    await self.messages.put(data)
                    continue
                arrival = ChunkArrival(data, now)
                if "streamed" in data:
                    part = self._partial.pop(data["request_id"])
                    arrival.frames, arrival.t_first, arrival.t_last = part.frames, part.t_first, part.t_last
                for i in range(data["frames"]):
                    arrival.frames.append(await self.ws.recv())
                    if i == 0:
                        arrival.t_first = time.perf_counter()
                if not data.get("streamed"):
                    arrival.t_last = time.perf_counter()
                self.received += 1
                await self.chunks.put(arrival)
        except websockets.ConnectionClosed:
            pass

    async def press(self, keys: list[str]) -> tuple[int, float]:
        """Send a keys.v1 event; returns its id and when it was sent (not waiting for the answer)."""
        from protocols import world_v1 as wire

        return await self.send_event(wire.keys_control({"mode": "state", "held": keys}))

    async def drain(self) -> list[ChunkArrival]:
        """Receive every chunk already granted, so the session is idle (no credit left)."""
        got = []
        while self.received < self.granted or not self.chunks.empty():
            got.append(await self.next_chunk())
        return got


async def stream_chunks(s: Stream, n: int, lead: int) -> list[ChunkArrival]:
    """Receive ``n`` chunks of a session granted ``lead`` credits before: one credit back per
    chunk (the server keeps its lead) except for the last ``lead``, so exactly ``n`` arrive."""
    got = []
    for i in range(n):
        c = await s.next_chunk()
        got.append(c)
        if i < n - lead:
            await s.credit(1)
    return got


async def idle_presses(s: Stream, clock: TickClock, n: int) -> list[dict[str, Any]]:
    """Key press -> first frame of an idle session (no credit): press, one credit, the chunk
    that applies it; beside it that tick's parts from the clock."""
    await s.drain()
    rows = []
    for i in range(n):
        n0 = clock.count()
        eid, t0 = await s.press(["d"] if i % 2 == 0 else ["a"])
        await s.credit(1)
        c = await s.next_chunk()
        await s.expect("event.accepted")
        assert eid in c.header["applied_event_ids"], (eid, c.header)
        tk = [t for t in clock.since(n0) if t["sessions"] == [s.sid]][-1]
        row = {"ttff_ms": round(1e3 * (c.t_first - t0), 2), "commit_ms": round(1e3 * (c.t_header - t0), 2),
               "last_frame_ms": round(1e3 * (c.t_last - t0), 2),
               "tick_total_ms": round(tk["total_ms"], 2), "transformer_ms": round(tk["transformer_ms"], 2),
               "vae_block_decode_ms": round(tk["decode_ms"], 2),
               "vae_first_frame_ms": round(tk["first_frame_ms"] or 0.0, 2),
               "press_to_tick_start_ms": round(1e3 * (tk["t_start"] - t0), 2),
               "tick_end_to_first_frame_ms": round(1e3 * (c.t_first - tk["t_end"]), 2)}
        rows.append(row)
        log(f"ttff {s.sid}{' (stream_frames)' if s.stream_frames else ''} {i}: {row['ttff_ms']} ms "
            f"(transformer {row['transformer_ms']}, decode {row['vae_block_decode_ms']}, first decoded "
            f"frame {row['vae_first_frame_ms']} into it)")
    return rows


def ttff_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tt, tick = med([r["ttff_ms"] for r in rows]), med([r["tick_total_ms"] for r in rows])
    dec = med([r["vae_block_decode_ms"] for r in rows])
    return {"ttff_ms_median": tt, "tick_ms_median": tick,
            "transformer_ms_median": med([r["transformer_ms"] for r in rows]),
            "vae_block_decode_ms_median": dec, "vae_first_frame_ms_median": med([r["vae_first_frame_ms"] for r in rows]),
            "goal": "ttff <= one tick + one VAE block decode", "goal_ms": round(tick + dec, 2),
            "within_goal": tt <= tick + dec}


def periods(arrivals: list[ChunkArrival]) -> list[float]:
    return [1e3 * (b.t_header - a.t_header) for a, b in zip(arrivals, arrivals[1:])]


# ------------------------------------------------------------------ served sections
async def served_sections(url: str, engine: Any, adapter: Any, clock: TickClock, args: argparse.Namespace,
                          device: torch.device, result: dict[str, Any], want: Callable[[str], bool],
                          save: Callable[[], None]) -> None:
    image = first_image(args.height, args.width)
    cfg = adapter.pipeline.cfg
    # Blocks after which a session holds its whole sink and window (its KV at full size).
    full = (cfg.sink_size + cfg.rolling_frames) // cfg.num_frames_per_block
    streams: dict[str, Stream] = {}
    residency = adapter.pipeline.residency

    async def session(name: str, seed: int, stream_frames: bool = False) -> Stream:
        if name not in streams:
            t = time.perf_counter()
            before = memory(device)
            streams[name] = await Stream.open(url, name, image, credits=0, seed=seed, stream_frames=stream_frames)
            await streams[name].press(["w"])
            await streams[name].expect("event.accepted")
            log(f"session {name} created in {time.perf_counter() - t:.1f}s (opens at its first tick)")
            result.setdefault("memory_per_session", {})[name] = {"before_create": before}
        return streams[name]

    async def warm(s: Stream, n: int) -> None:
        await s.credit(n)
        for _ in range(n):
            c = await s.next_chunk()
            log(f"{s.sid}: warm-up chunk {c.header['chunk_index']} (tick {c.header['tick_ms']:.0f} ms)")
        result["memory_per_session"][s.sid]["after_warmup"] = memory(device)

    try:
        # -- served: one session, credits kept 2 ahead ---------------------------------------
        if want("served") or want("ttff") or want("sessions") or want("swap") or want("kv"):
            a = await session("A", 2)
            await warm(a, args.warmup_ticks)
        if want("served") and result["budget_ok"]("served"):
            a = streams["A"]
            n0 = clock.count()
            await a.credit(2)
            got = await stream_chunks(a, args.ticks + 1, lead=2)
            ps = periods(got)
            ticks = [t for t in clock.since(n0) if t["sessions"] == ["A"]]
            bare_ms = (result.get("bare") or {}).get("tick_ms_median")
            served = {"chunk_period_ms": [round(p, 2) for p in ps], "chunk_period_ms_median": med(ps),
                      "server_tick_ms_median": med([c.header["tick_ms"] for c in got]),
                      "header_to_last_frame_ms_median": med([1e3 * (c.t_last - c.t_header) for c in got]),
                      "phases": phase_summary(ticks), "bare_tick_ms_median": bare_ms,
                      "goal": "served <= 1.05x bare"}
            if bare_ms and ps:
                served["served_over_bare"] = round(statistics.median(ps) / bare_ms, 4)
            result["served"] = served
            log(f"served: chunk period {served['chunk_period_ms_median']} ms vs bare {bare_ms} ms "
                f"-> {served.get('served_over_bare')}x")
            save()

        # -- ttff: key press -> first decoded frame --------------------------------------------
        if want("ttff") and result["budget_ok"]("ttff"):
            a = streams["A"]
            idle = await idle_presses(a, clock, args.ttff_presses)
            streaming = []
            rng = random.Random(0)
            tick_s = statistics.median([r["tick_total_ms"] for r in idle]) / 1e3 if idle else 1.0
            for i in range(args.ttff_streaming_presses):
                await a.credit(1)
                c0 = await a.next_chunk()
                await a.credit(1)      # the next tick starts now; press somewhere inside it
                await asyncio.sleep(rng.uniform(0.0, tick_s))
                eid, t0 = await a.press(["w", "d"] if i % 2 == 0 else ["w"])
                await a.credit(1)
                while True:    # the chunk in flight at the press, if any, then the one applying it
                    c = await a.next_chunk()
                    if eid in c.header["applied_event_ids"]:
                        break
                await a.expect("event.accepted")
                await a.drain()
                streaming.append({"ttff_ms": round(1e3 * (c.t_first - t0), 2),
                                  "press_after_previous_chunk_ms": round(1e3 * (t0 - c0.t_header), 2)})
                log(f"ttff streaming {i}: {streaming[-1]['ttff_ms']} ms")
            out: dict[str, Any] = {"idle": idle, "streaming": streaming}
            if idle:
                out["idle_summary"] = ttff_summary(idle)
            if streaming:
                out["streaming_ttff_ms_median"] = med([r["ttff_ms"] for r in streaming])
                out["streaming_ttff_ms_max"] = max(r["ttff_ms"] for r in streaming)
            out["note"] = ("session A is not streamed: the block's frames go after the tick (first frame ~ tick "
                           "end); a press during a tick waits for the next one. stream_frames: session B, after "
                           "the sessions section")
            result["ttff"] = out
            save()

        # -- kv: the steady session's bytes vs the capacity formula (read on the engine thread) ------
        if want("kv") and "A" in streams:
            await streams["A"].drain()
            result["kv"] = await engine.control(lambda: kv_bytes(adapter, "A"))
            log(f"kv: {result['kv']['session_bytes_measured']} bytes measured, "
                f"{result['kv']['session_bytes_formula']} by the formula")
            save()

        # -- sessions: two resident, ticking at once ---------------------------------------------
        if (want("sessions") or want("swap")) and result["budget_ok"]("sessions"):
            a = streams["A"]
            b = await session("B", 3, stream_frames=True)
            await warm(b, max(1, full - args.ticks))    # sink + window full by the end
            await a.drain()
            m0, n0, t0 = residency.metrics(), clock.count(), time.perf_counter()
            await asyncio.gather(a.credit(1), b.credit(1))
            got = await asyncio.gather(stream_chunks(a, args.ticks, 1), stream_chunks(b, args.ticks, 1))
            wall = time.perf_counter() - t0
            await asyncio.gather(a.drain(), b.drain())
            m1 = residency.metrics()
            ticks = clock.since(n0)
            order = "".join(t["sessions"][0] for t in ticks)
            result["sessions"] = {
                "sessions": 2, "chunks_each": args.ticks, "wall_s": round(wall, 2), "engine_order": order,
                "chunk_period_ms_median": {s.sid: med(periods(g)) for s, g in zip((a, b), got)},
                "chunks_per_s_total": round(2 * args.ticks / wall, 3),
                "tick_phases": phase_summary(ticks), "swap_outs": m1["swap_outs"] - m0["swap_outs"],
                "swap_ins": m1["swap_ins"] - m0["swap_ins"], "resident_after": m1["resident_sessions"],
                "memory": memory(device)}
            log(f"sessions: 2 resident, order {order}, swaps {result['sessions']['swap_outs']}")
            save()
            if want("ttff") and result["budget_ok"]("ttff_stream_frames"):
                rows = await idle_presses(b, clock, args.ttff_presses)
                result.setdefault("ttff", {})["stream_frames"] = {"session": "B", "idle": rows,
                                                                  "idle_summary": ttff_summary(rows)}
                save()

        # -- swap: three sessions on the pool for two ----------------------------------------------
        if want("swap") and result["budget_ok"]("swap"):
            from bench.kv.bench_kv import bandwidth

            if device.type == "cuda":
                bw = bandwidth(device, args.bandwidth_gib * GIB)
                log(f"pinned copy: h2d {bw['h2d_GBps']:.1f} GB/s, d2h {bw['d2h_GBps']:.1f} GB/s")
            else:
                bw = None
            a, b = streams["A"], streams["B"]
            c3 = await session("C", 4)
            m0, n0, t0 = residency.metrics(), clock.count(), time.perf_counter()
            await warm(c3, full)     # full KV before its first swap; its first tick evicts A or B
            rounds = args.swap_rounds
            await asyncio.gather(a.credit(1), b.credit(1), c3.credit(1))
            got = await asyncio.gather(*(stream_chunks(s, rounds, 1) for s in (a, b, c3)))
            wall = time.perf_counter() - t0
            await asyncio.gather(a.drain(), b.drain(), c3.drain())
            m1 = residency.metrics()
            ticks = clock.since(n0)
            swaps = [t for t in ticks if t["swap_outs"] or t["swap_ins"]]
            per = []
            for t in swaps:
                row = {"session": t["sessions"][0], "swap_outs": t["swap_outs"], "swap_ins": t["swap_ins"],
                       "out_s": round(t["swap_out_s"], 4), "in_s": round(t["swap_in_s"], 4),
                       "out_bytes": t["swap_out_bytes"], "in_bytes": t["swap_in_bytes"],
                       "tick_ms": round(t["total_ms"], 1)}
                if t["swap_out_s"] > 0:
                    row["out_GBps"] = round(t["swap_out_bytes"] / t["swap_out_s"] / 1e9, 2)
                if t["swap_in_s"] > 0:
                    row["in_GBps"] = round(t["swap_in_bytes"] / t["swap_in_s"] / 1e9, 2)
                per.append(row)
            steady = per[2:] or per
            sw: dict[str, Any] = {
                "sessions": 3, "pool_sessions": args.pool_sessions, "rounds": rounds, "wall_s": round(wall, 2),
                "engine_order": "".join(t["sessions"][0] for t in ticks), "swaps": per,
                "swap_outs": m1["swap_outs"] - m0["swap_outs"], "swap_ins": m1["swap_ins"] - m0["swap_ins"],
                "drops": m1["drops"] - m0["drops"],
                "chunk_period_ms_median": {s.sid: med(periods(g)) for s, g in zip((a, b, c3), got)},
                "tick_phases": phase_summary(ticks), "pinned_copy_bandwidth": bw,
                "host_bytes_after": m1["host_bytes"], "memory": memory(device),
                "note": "the first swap-outs also allocate (pin) host buffers; steady = from the third swap on"}
            def median(xs: list[float]) -> float | None:
                return statistics.median(xs) if xs else None

            out_s = median([t["swap_out_s"] for t in swaps[2:] or swaps if t["swap_out_s"]])
            in_s = median([t["swap_in_s"] for t in swaps[2:] or swaps if t["swap_in_s"]])
            nbytes = median([r["out_bytes"] for r in steady if r["out_bytes"]])
            if out_s and in_s and nbytes:
                nbytes = int(nbytes)
                sw["steady"] = {"swap_out_s": out_s, "swap_in_s": in_s, "bytes": nbytes,
                                "swap_out_GBps": round(nbytes / out_s / 1e9, 2),
                                "swap_in_GBps": round(nbytes / in_s / 1e9, 2)}
                if bw:
                    ideal = nbytes / (bw["d2h_GBps"] * 1e9) + nbytes / (bw["h2d_GBps"] * 1e9)
                    sw["steady"].update(d2h_GBps=round(bw["d2h_GBps"], 2), h2d_GBps=round(bw["h2d_GBps"], 2),
                                        time_vs_bandwidth=round((out_s + in_s) / ideal, 3))
            if "steady" in sw:
                from kv.capacity import session_bytes

                sw["steady"]["session_bytes_formula"] = session_bytes(adapter.pipeline.geometry)
                sw["steady"]["bytes_equal_formula"] = sw["steady"]["bytes"] == sw["steady"]["session_bytes_formula"]
            result["swap"] = sw
            log(f"swap: {sw['swap_outs']} out / {sw['swap_ins']} in, order {sw['engine_order']}, "
                f"steady {sw.get('steady')}")
            save()

    finally:
        for s in streams.values():
            try:
                await s.close()
            except Exception:  # noqa: BLE001 - a bench tears down what it can
                traceback.print_exc()


def kv_bytes(adapter: Any, sid: str) -> dict[str, Any]:
    """One steady session's KV, measured from the pool tensors, vs ``kv.capacity.session_bytes``."""
    from kv import retention
    from kv.capacity import session_bytes

    p = adapter.pipeline
    g, cache, res = p.geometry, p.cache, p.residency
    st = cache.storage
    if res.is_swapped(sid):
        raise RuntimeError(f"session {sid} is swapped out; measure it while resident")
    held = len(cache.table(sid).held)
    block_bytes = sum(t[0].numel() * t[0].element_size() for t in st.k + st.v)   # one block, every layer
    cross_bytes = sum(t[0].numel() * t[0].element_size() for t in st.cross_k + st.cross_v)
    state = res.state(sid)
    state_bytes = state.nbytes if state is not None else 0
    measured = held * block_bytes + cross_bytes + state_bytes
    formula = session_bytes(g)
    retained = retention.max_retained_frames(g.sink_frames, g.window_frames, g.span_frames)
    return {"session": sid, "committed_frames": cache.committed_frames(sid), "held_blocks": held,
            "retained_frames_formula": retained, "pages_per_frame": g.pages_per_frame,
            "block_bytes_measured": block_bytes, "page_bytes_formula": g.page_bytes,
            "cross_bytes_measured": cross_bytes, "cross_bytes_formula": g.cross_bytes,
            "state_bytes_measured": state_bytes, "state_bytes_formula": g.model_state_bytes,
            "session_bytes_measured": measured, "session_bytes_formula": formula,
            "session_gib": round(measured / GIB, 3), "swap_bytes_reported": cache.swap_bytes(sid) + state_bytes,
            "equal_to_the_byte": measured == formula, "difference_bytes": measured - formula}


def memory_summary(result: dict[str, Any], adapter: Any, ticks: list[dict[str, Any]]) -> dict[str, Any]:
    """Device memory: weights, pool, per-session state, and the high-water mark of the ticks run
    with 1, 2 and 3 sessions open; host memory used for swapped sessions."""
    model = result.get("model", {})
    peaks: dict[str, int] = {}
    for t in ticks:
        if "peak_allocated_bytes" in t:
            k = f"{t['open_sessions']}_open"
            peaks[k] = max(peaks.get(k, 0), t["peak_allocated_bytes"])
    end = result.get("memory_end", {})
    weights = sum(model.get(k, 0) for k in ("transformer_bytes", "vae_bytes", "text_encoder_bytes"))
    return {"weights_bytes": weights, "pool_bytes": model.get("pool_bytes"),
            "decode_state_bytes_per_session": adapter.pipeline.geometry.model_state_bytes,
            "allocated_after_weights": model.get("memory_after_weights", {}).get("allocated_bytes"),
            "allocated_after_pool": model.get("memory_after_pool", {}).get("allocated_bytes"),
            "tick_peak_allocated_bytes_by_open_sessions": peaks,
            "tick_peak_allocated_gib_by_open_sessions": {k: round(v / GIB, 2) for k, v in peaks.items()},
            "host_swap_bytes_max": max((t.get("host_bytes", 0) for t in ticks), default=0),
            "pinned_host_reserved_bytes_end": end.get("pinned_host_reserved_bytes"),
            "pinned_host_peak_bytes": end.get("pinned_host_peak_bytes"),
            "host_rss_peak_bytes": end.get("host_rss_peak_bytes")}


def buffer_bytes(module: Any) -> int:
    """FP8 layers keep their weights and scales as buffers."""
    return sum(b.numel() * b.element_size() for b in module.buffers())


# ------------------------------------------------------------------ main
def main_ab(args: argparse.Namespace, device: torch.device) -> None:
    from bench.world.lingbot_ab import run_ab

    if not args.ab:
        args.ab = list(DEFAULT_VARIANTS)
    result: dict[str, Any] = {
        "benchmark": "LingBot-World opt-in shortcuts vs the exact path, one run: chunk time, transformer "
                     "passes, latent error and frame PSNR over the same chunks (issue 45)",
        "command": " ".join(["python3", "-m", "bench.world.bench_lingbot", *sys.argv[1:]]),
        "env": environment(device), "device": str(device), "tiny": args.tiny,
        "height": args.height, "width": args.width,
        "random_weights": "transformer at full size" + (" (tiny)" if args.tiny else "") +
                          "; Wan VAE default config; TAEHV random in the taew2_1 layout"}

    def save(ab: dict[str, Any]) -> None:   # after each variant: a run cut short keeps what it measured
        result["ab"] = ab
        result["elapsed_s"] = round(time.perf_counter() - START, 1)
        emit(result, args.out, echo=False)

    save(run_ab(args, device, progress=save))
    print(json.dumps({k: result["ab"].get(k) for k in ("errors",)} | {"elapsed_s": result["elapsed_s"]}),
          flush=True)


def main() -> None:
    ap = BenchArguments(__doc__, SECTIONS, size=(480, 832), tiny=(32, 32))
    ap.add_argument("--warmup-ticks", type=int, default=6,
                    help="ticks before timing: 5 blocks fill the sink and window, the 6th is the first "
                         "at the steady shape (auto attention tunes once per shape)")
    ap.add_argument("--ticks", type=int, default=3, help="timed ticks (bare, served, each of two sessions)")
    ap.add_argument("--swap-rounds", type=int, default=3, help="chunks each of the three sessions gets")
    ap.add_argument("--ttff-presses", type=int, default=3)
    ap.add_argument("--ttff-streaming-presses", type=int, default=2)
    ap.add_argument("--options", default="",
                    help="the lingbot entry's shortcuts, e.g. 'steps=1&reuse_kv=1&fp8=ffn&decoder=taehv:random' "
                         "(taehv:random: random weights in the taew2_1 layout); default: the exact path")
    ap.add_argument("--ab", nargs="*", default=None, metavar="OPTIONS",
                    help="A/B mode only: each OPTIONS (entry syntax) against the exact path "
                         f"(no value: {' '.join(repr(v) for v in DEFAULT_VARIANTS)})")
    ap.add_argument("--ab-chunks", type=int, default=8, help="chunks per variant in the A/B mode")
    ap.add_argument("--ab-warmup", type=int, default=2, help="exact-path chunks run first on CUDA, untimed")
    ap.add_argument("--seed", type=int, default=0, help="random weights, first image and noise")
    ap.add_argument("--vae-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="float32 is what the factory loads (models/world/lingbot/checkpoint.py)")
    ap.add_argument("--pool-sessions", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--batch-wait-ms", type=float, default=None, help="engine returner wait (default: the server's)")
    ap.add_argument("--bandwidth-gib", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=400.0, help="skip a section that would start after this")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.ab is not None:
        main_ab(args, device)
        return
    scratch = tempfile.TemporaryDirectory()
    args.scratch = scratch.name

    result: dict[str, Any] = {
        "benchmark": "LingBot-World full geometry: bare tick vs served world.v1, key press to first frame, "
                     "sessions and swap, KV bytes, memory, attention (issue 16)",
        "command": " ".join(["python3", "-m", "bench.world.bench_lingbot", *sys.argv[1:]]),
        "env": environment(device), "device": str(device), "tiny": args.tiny,
        "anchors": {"block_forward_ms": 14.7, "tick_ms_40_layers_x_5_passes": 2900,
                    "attention_gather_sdpa_vs_contiguous": "0.93-0.94x"},
        "skipped": {}, "errors": {},
    }
    run = Sections(result, args.out, args.only, args.budget_s, START, log)
    save, section, want = run.save, run.section, run.want
    result["budget_ok"] = run.budget_ok

    if any(want(s) for s in SECTIONS if s != "attention"):
        log("building the model (random weights on the device) ...")
        adapter, info = build(args, device)
        result["model"] = info
        try:
            result["capacity"] = capacity_plan(adapter, device)
        except Exception as e:  # noqa: BLE001 - a figure, not a reason to stop
            result["errors"]["capacity"] = f"{type(e).__name__}: {e}"
        log(f"built in {info['build_s']} s: transformer {info['transformer_params'] / 1e9:.2f} B params, "
            f"pool {info['pool_blocks']} blocks ({info['pool_bytes'] / GIB:.1f} GiB)")
        save()
        clock = TickClock(adapter.pipeline, device)
        # On a fresh thread, as the engine runs the model on its own (on a loaded CPU the main
        # thread's intra-op pool was 5-10x slower than a new thread's for the same tick).
        section("bare", lambda: on_spent_thread(bare, adapter, clock, args, device))
        if any(want(s) for s in ("served", "ttff", "sessions", "swap", "kv")):
            with serving(adapter, device, args.batch_wait_ms, max_batch=args.max_batch) as (addr, app):
                log(f"serving on {addr}")
                run.attempt("served_sections", lambda: asyncio.run(served_sections(
                    f"ws://{addr}/v1/realtime/world", app.state.engine, adapter, clock, args, device, result, want,
                    save)))
        result["memory_end"] = memory(device)
        result["memory"] = memory_summary(result, adapter, clock.since(0))
        result["residency_end"] = adapter.pipeline.residency.metrics()
        result["ticks"] = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()}
                           for t in clock.since(0)]
        save()
    # Last, so the model's figures come first within the time budget (the model stays loaded:
    # one layer's pool and the fp32 reference fit beside it).
    section("attention", lambda: attention(args, device))
    save()
    summary = {k: result.get(k) for k in ("errors", "skipped", "elapsed_s")}
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()

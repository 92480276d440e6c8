#!/usr/bin/env python3
"""Matrix-Game 2.0 at full size on one GPU: many players batched, served vs bare, in one run (issue 49).

    python3 -m bench.world.bench_matrix_game --out /tmp/out/matrix_game_wan.json                  # GPU, Wan VAE
    python3 -m bench.world.bench_matrix_game --decoder taehv --out /tmp/out/matrix_game_taehv.json  # small decoder
    python3 -m bench.world.bench_matrix_game --tiny --device cpu --out /tmp/mg.json                # CPU smoke test

The model is built with random weights directly on the device: the base variant's DiT
(``config.FULL``: dim 1536, 30 layers, 12 heads x 128, FFN 8960, action modules in blocks
0..14) in bf16, the Wan 2.1 VAE at its real config (``AutoencoderKLWan`` base_dim 96, z 16;
the decoder is what ticks run) in bf16, as ``realtime serve`` loads them, and a CLIP vision
tower of the real width and token count (1280, 257 tokens) with one block run (it only runs
when a session opens). ``--decoder taehv`` decodes with the TAEHV decoder (random weights in
the taew2_1 layout, float16) instead of the Wan VAE. Frames are 352 x 640 (880 tokens per
latent frame, 2,640 query tokens per block of 3 latent frames = 12 video frames), the
variant's 3 denoising passes and the committing pass per block. ``--tiny``: the tiny
checkpoint's sizes (``config.TINY``) at 32 x 64, for a CPU smoke test.

Sections, in the order they run (``--only`` picks some; each rewrites the JSON when it ends
and is skipped when it would start after ``--budget-s``; ``bare`` and ``served`` also stop
between session counts):

``bare``     for N in ``--sessions``: N sessions batched in one forward per tick (the engine's
             call, ``adapter.run_batch`` + ``end_tick``) vs the same N sessions one at a time,
             round robin (how one-chunk-at-a-time servers share a GPU): per round the time, the
             transformer and decode parts, frames/s per session and in all, p99 tick and round
             times, the estimated transformer FLOP and the TFLOP/s reached, CUDA kernel launches
             per round (up to ``--profile-max-sessions``), peak GPU memory. Bare stops at
             ``--bare-share`` of the budget (a count whose forecast would pass it is not run)
             so that the served sections keep their time.
``kv``       a steady session's KV bytes (held pages, CLIP cross slot, decoder and action state)
             measured from the tensors vs ``kv.capacity.session_bytes``; the sessions
             ``kv.capacity.plan_capacity`` fits at 0.9 of the device's memory after the weights;
             and the same formula at full size for an 80 GiB and a 141 GiB card (no device needed).
``served``   for N in ``--served-sessions``: a real uvicorn server on loopback and N real
             websockets players in a process of their own (world.v1, a PNG first image, keys.v1
             ``w`` held, mouse.v1 deltas sent with every chunk, credits kept 2 ahead): per
             session the chunk period and frames/s, the slowest session, p99 of the server's
             tick time, served/bare per session (the slowest against the bare batched figure).
``ttff``     one player alone with ``stream_frames``: key press (event + one credit to an idle
             session) to the first frame of the chunk that applies it, on the wire.

Progress goes to stderr; the JSON (``--out``) holds the command, the machine and versions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from bench.machine import GIB, device_memory, environment
from bench.timing import med, p99, sync
from bench.sections import Sections
from bench.world.harness import BenchArguments, TickClock, WorldStream, first_image, serving
from realtime.server.inventory import on_spent_thread

SECTIONS = ("bare", "served", "ttff", "kv")
START = time.perf_counter()
MODEL = "matrix-game"
GPU_SESSIONS = (1, 2, 4, 8, 16, 32)
GPU_SERVED_SESSIONS = (1, 2, 4, 8, 16)


def log(msg: str) -> None:
    print(f"[bench_matrix_game {time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# The packages whose versions a run records.
PACKAGES = ("torch", "diffusers", "numpy", "uvicorn", "starlette", "websockets", "triton")


# ------------------------------------------------------------------ build
@torch.no_grad()
def init_random_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter in place: matrices N(0, 0.5/fan_in), modulation tables N(0, 1/dim),
    biases 0, norm gains 1 (activations stay finite through 30 layers; speed does not
    depend on the values)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("modulation"):
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
        elif p.ndim >= 2:
            p.normal_(0.0, math.sqrt(0.5 / math.prod(p.shape[1:])), generator=gen)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)


def random_dit(cfg: Any, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> Any:
    """``MatrixGameDiT(cfg)`` allocated once on ``device`` in ``dtype`` (``meta`` first, then
    ``to_empty``: no host copy of the weights), random."""
    from models.world.matrix_game.model import MatrixGameDiT

    with torch.device("meta"):
        model = MatrixGameDiT(cfg)
    model = model.to(dtype).to_empty(device=device)
    init_random_(model, seed)
    return model.eval().requires_grad_(False)


def parts(tiny: bool, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any, Any]:
    """The DiT (base variant), the Wan VAE and the CLIP vision tower, random, on ``device``
    (the ``meta`` device builds them at full size without memory: geometry only)."""
    from models.world.wan_vae_build import make_vae
    from models.world.matrix_game.config import CLIP_DIM, FULL, TINY
    from models.world.wan_clip import WanImageEncoder

    from models.world.matrix_game.model import MatrixGameDiT

    device = torch.device(device)
    cfg = (TINY if tiny else FULL)["universal"]
    if device.type == "meta":
        with torch.device("meta"):
            dit = MatrixGameDiT(cfg).to(dtype)
    else:
        dit = random_dit(cfg, device, dtype, seed)
    torch.manual_seed(seed)
    with torch.device(device):
        vae = make_vae(base_dim=4 if tiny else 96, z_dim=16)
        # The real tower: 1280 wide, 14-pixel patches on a 16 x 16 grid (257 tokens); 2 blocks,
        # the last unused (upstream reads the penultimate), instead of 32.
        clip = (WanImageEncoder(dim=CLIP_DIM, patch=2, grid=2, layers=2, mlp=16, out_dim=6) if tiny else
                WanImageEncoder(dim=CLIP_DIM, patch=14, grid=16, layers=2, mlp=5120, out_dim=1024))
    vae = vae.to(dtype).eval().requires_grad_(False)
    clip = clip.to(dtype).eval().requires_grad_(False)
    return dit, vae, clip


def parameter_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def build(args: argparse.Namespace, device: torch.device) -> tuple[Any, dict[str, Any]]:
    from models.world.matrix_game.adapter import MatrixGameWorld
    from models.world.matrix_game.config import VARIANTS
    from models.world.matrix_game.pipeline import MatrixGamePipeline

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    dit, vae, clip = parts(args.tiny, device, dtype, args.seed)
    taehv = None
    if args.decoder == "taehv":
        from models.world.taehv import random_state_dict, taehv_from_state_dict

        taehv = taehv_from_state_dict(random_state_dict(seed=args.seed), device=device,
                                      dtype=torch.float16 if cuda else torch.float32)
    sync(device)
    built_s = time.perf_counter() - t0
    after_weights = device_memory(device)
    pool = max(max(args.sessions, default=1), max(args.served_sessions, default=1), 1)
    if cuda:   # the pool and states for as many sessions as fit at 0.9 of what is free, at most ``pool``
        from kv import plan_capacity
        from models.world.matrix_game.pipeline import session_geometry

        g = session_geometry(dit, vae, clip, args.height, args.width, taehv)
        pool = plan_capacity(g, available_bytes=torch.cuda.mem_get_info(device)[0], fraction=0.9,
                             requested_sessions=pool, ticks_in_flight=pool).capacity
    pipeline = MatrixGamePipeline(dit, VARIANTS["universal"], vae, clip, height=args.height, width=args.width,
                                  max_sessions=pool, device=device, taehv=taehv)
    adapter = MatrixGameWorld(pipeline, max_batch=pool)
    sync(device)
    cfg = pipeline.cfg
    info = {
        "build_s": round(built_s, 2), "dtype": str(dtype).replace("torch.", ""), "variant": "universal (base)",
        "transformer_config": cfg.to_config(), "decoder": pipeline.decoder_name,
        "transformer_params": sum(p.numel() for p in dit.parameters()),
        "transformer_bytes": parameter_bytes(dit), "vae_bytes": parameter_bytes(vae),
        "clip_bytes": parameter_bytes(clip), "taehv_bytes": parameter_bytes(taehv) if taehv is not None else None,
        "height": args.height, "width": args.width, "latent_hw": list(pipeline.latent_hw),
        "tokens_per_latent_frame": pipeline.tokens_per_frame,
        "query_tokens_per_block": 3 * pipeline.tokens_per_frame,
        "passes_per_block": pipeline.passes_per_block, "frames_per_chunk": adapter.geometry.frames_per_chunk,
        "fps_of_the_model": adapter.geometry.fps,
        "pool_sessions": pool, "pool_blocks": pipeline.cache.pool.num_blocks,
        "pool_bytes": pipeline.cache.storage.nbytes(),
        "memory_after_weights": after_weights, "memory_after_pool": device_memory(device),
        "random_weights": ("tiny sizes (config.TINY)" if args.tiny else
                           "DiT at full size (config.FULL base); Wan VAE at its real config (base_dim 96); "
                           "CLIP tower 1280 wide, 257 tokens, 1 block run (runs only when a session opens)")
                          + ("; TAEHV decoder random in the taew2_1 layout" if taehv is not None else ""),
    }
    return adapter, info


def transformer_flops(adapter: Any) -> dict[str, Any]:
    """Estimated FLOP of one session's block (2 per multiply-add): every pass's linear layers
    over the block's query tokens (the action modules' counted as if per token: an upper
    bound), self-attention over the block and the held frames, cross-attention over the CLIP
    tokens; the cross K/V projections run once per session and are not counted."""
    p = adapter.pipeline
    cfg, dit = p.cfg, p.model
    S = p.tokens_per_frame
    L = 3 * S
    keys = L + (cfg.local_attn_size - 3) * S
    clip_tokens = p.geometry.cross_tokens
    linear = 0
    for name, m in dit.blocks.named_modules():
        if isinstance(m, torch.nn.Linear) and not (".cross_attn.k" in f".{name}" or ".cross_attn.v" in f".{name}"):
            linear += m.in_features * m.out_features
    per_pass = 2 * L * linear + cfg.num_layers * (4 * L * keys * cfg.dim + 4 * L * clip_tokens * cfg.dim)
    return {"query_tokens": L, "keys_attended": keys, "linear_weights_per_token": linear,
            "per_pass": per_pass, "per_block": per_pass * p.passes_per_block, "passes": p.passes_per_block,
            "convention": "an estimate: 2 FLOP per multiply-add; the action modules' linears counted per "
                          "token (an upper bound); the cross K/V projections (once per session) left out"}


# ------------------------------------------------------------------ per-tick clock
class Clock(TickClock):
    """The shared per-tick clock (``bench.world.harness.TickClock``); transformer time = tick -
    decode - swap."""

    def finish(self, tick: dict[str, Any], m0: dict[str, Any], m1: dict[str, Any], decode_start: float) -> None:
        tick["transformer_ms"] = tick["total_ms"] - tick["decode_ms"] - tick["swap_ms"]


# ------------------------------------------------------------------ bare
def work(adapter: Any, sid: str, k: int, seed: int) -> Any:
    """Session ``sid``'s tick ``k``: ``w`` held and a small mouse motion every frame."""
    from models.world.matrix_game.adapter import MatrixGameTick

    F = adapter.geometry.frames_per_chunk
    mouse = tuple((0.05 * math.sin(0.3 * (k * F + i)), 0.02) for i in range(F))
    return MatrixGameTick(sid, f"{sid}:{k}", k, (), None, (frozenset({"w"}),) * F, seed=seed, mouse=mouse)


def tick(adapter: Any, works: list[Any], device: torch.device) -> float:
    """One engine call (``run_batch``, then ``end_tick`` of each session); returns ms."""
    sync(device)
    t = time.perf_counter()
    adapter.run_batch(works)
    for w in works:
        adapter.end_tick(w.session_id, True)
    sync(device)
    return 1e3 * (time.perf_counter() - t)


def bare_one(adapter: Any, clock: Clock, n: int, args: argparse.Namespace, device: torch.device,
             flops: dict[str, Any]) -> dict[str, Any]:
    F = adapter.geometry.frames_per_chunk
    out: dict[str, Any] = {"sessions": n}
    for mode in ("batched", "one_at_a_time"):
        ids = [f"{mode[0]}{n}-{i}" for i in range(n)]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rounds, per_tick, n0 = [], [], 0

        def one_round(k: int) -> tuple[float, list[float]]:
            works = [work(adapter, sid, k, i) for i, sid in enumerate(ids)]
            if mode == "batched":
                ms = tick(adapter, works, device)
                return ms, [ms]
            ticks_ms = [tick(adapter, [w], device) for w in works]
            return sum(ticks_ms), ticks_ms

        try:
            for k in range(args.warmup_ticks + args.ticks):
                if k == args.warmup_ticks:
                    n0 = clock.count()
                ms, ticks_ms = one_round(k)
                if k >= args.warmup_ticks:
                    rounds.append(ms)
                    per_tick.extend(ticks_ms)
            timed = clock.since(n0)
            launches = (kernel_launches(lambda: one_round(args.warmup_ticks + args.ticks), device)
                        if n <= args.profile_max_sessions else None)
        finally:
            for sid in ids:
                adapter.drop_session(sid)
        round_s = statistics.median(rounds) / 1e3
        transformer = sum(t["transformer_ms"] for t in timed) / max(1, len(rounds))
        decode = sum(t["decode_ms"] for t in timed) / max(1, len(rounds))
        # A session's period between chunks is the round: one batched tick, or every session's turn.
        row = {"round_ms": [round(x, 2) for x in rounds], "round_ms_median": med(rounds), "round_ms_p99": p99(rounds),
               "tick_ms_median": med(per_tick), "tick_ms_p99": p99(per_tick),
               "fps_per_session": round(F / round_s, 3), "fps_total": round(n * F / round_s, 3),
               "transformer_ms_per_round": round(transformer, 2), "decode_ms_per_round": round(decode, 2),
               "transformer_ms_per_session_block": round(transformer / n, 3),
               "decode_ms_per_session_block": round(decode / n, 3),
               "transformer_tflop_per_s": float(f"{n * flops['per_block'] / (transformer / 1e3) / 1e12:.4g}")
               if transformer > 0 else None,
               "forwards_per_round": len(timed) // max(1, len(rounds))}
        if launches is not None:
            row["kernel_launches_per_round"] = launches
        if device.type == "cuda":
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out[mode] = row
    b, s = out["batched"], out["one_at_a_time"]
    out["batched_over_one_at_a_time"] = round(b["fps_total"] / s["fps_total"], 4)
    bt, st = b["transformer_ms_per_session_block"], s["transformer_ms_per_session_block"]
    out["transformer_speedup"] = round(st / bt, 4) if bt > 0 else None
    return out


def kernel_launches(fn: Callable[[], Any], device: torch.device) -> int | None:
    """CUDA kernels one more (untimed) round launches, by the profiler: with the transformer
    time per session block, where batching's gain comes from (fewer, larger launches).
    None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    return sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key)


def counts(sessions: list[int], pool: int, out: dict[str, Any], budget_ok: Callable[[str], bool],
           section: str) -> Iterator[int]:
    """The session counts a section runs, in order: one the pool cannot hold is noted in
    ``out["not_run"]`` and passed over; the first that would start past the budget ends them."""
    for n in sessions:
        if n > pool:
            out.setdefault("not_run", {})[str(n)] = f"the pool holds {pool} sessions"
            continue
        if not budget_ok(f"{section}[{n}]"):
            return
        yield n


def bare(adapter: Any, clock: Clock, args: argparse.Namespace, device: torch.device,
         result: dict[str, Any], budget_ok: Callable[[str], bool], save: Callable[[], None]) -> dict[str, Any]:
    flops = transformer_flops(adapter)
    pool = adapter.pipeline.cache.max_sessions
    out: dict[str, Any] = {"flops": flops, "rows": [],
                           "goals": {"alone_fps": ">= 60 frames/s of model output",
                                     "batched_over_one_at_a_time_at_8": ">= 1.3 with a lower p99 tick"}}
    result["bare"] = out
    # The served sections need time after this one: bare stops at its share of the budget,
    # and a count whose forecast (the last count's seconds per session and round) would pass it.
    until = args.bare_share * args.budget_s
    per_session_round = 0.0
    rounds = 2 * (args.warmup_ticks + args.ticks + 1)
    for n in counts(args.sessions, pool, out, budget_ok, "bare"):
        forecast = per_session_round * n * rounds
        if time.perf_counter() - START + forecast > until:
            out.setdefault("not_run", {})[str(n)] = (f"forecast {forecast:.0f} s would pass bare's share of the "
                                                     f"budget ({until:.0f} s)")
            break
        t0 = time.perf_counter()
        row = bare_one(adapter, clock, n, args, device, flops)
        per_session_round = (time.perf_counter() - t0) / (n * rounds)
        out["rows"].append(row)
        log(f"bare N={n}: batched {row['batched']['fps_per_session']} fps/session "
            f"({row['batched']['fps_total']} total, tick {row['batched']['tick_ms_median']} ms), one at a time "
            f"{row['one_at_a_time']['fps_total']} total -> {row['batched_over_one_at_a_time']}x")
        save()
    return out


# ------------------------------------------------------------------ a world.v1 client
@dataclass
class Arrival:
    header: dict[str, Any]
    t_header: float
    t_first: float | None = None
    frames: int = 0


class Player(WorldStream):
    """One world.v1 session on its own websocket; a reader task timestamps every chunk's
    header and first frame (streamed frames too) as they arrive."""

    expect_timeout_s = 300.0

    def __init__(self, ws: Any, sid: str) -> None:
        self._partial: dict[str, Arrival] = {}
        super().__init__(ws, sid)

    @classmethod
    async def open(cls, url: str, sid: str, image: bytes, seed: int, stream_frames: bool = False,
                   fmt: str = "rgb8") -> "Player":
        return await cls.create(url, sid, image, model=MODEL, seed=seed, format=fmt, credits=0,
                                stream_frames=stream_frames)

    async def _read(self) -> None:
        import websockets

        try:
            while True:
                data = json.loads(await self.ws.recv())
                now = time.perf_counter()
                kind = data.get("type")
                if kind == "chunk.frames":
                    part = self._partial.setdefault(data["request_id"], Arrival(data, now))
                    for _ in range(data["frames"]):
                        await self.ws.recv()
                        part.t_first = part.t_first or time.perf_counter()
                        part.frames += 1
                    continue
                if kind != "chunk":
                    await self.messages.put(data)
                    continue
                arrival = self._partial.pop(data["request_id"], None) or Arrival(data, now)
                arrival.header, arrival.t_header = data, now
                for _ in range(data["frames"]):
                    await self.ws.recv()
                    arrival.t_first = arrival.t_first or time.perf_counter()
                    arrival.frames += 1
                await self.chunks.put(arrival)
        except websockets.ConnectionClosed:
            pass

    async def move(self, keys: list[str], k: int) -> tuple[int, float]:
        """keys.v1 ``keys`` held and a mouse.v1 motion for the next chunk; returns the event's
        id and when it went out (its ``event.accepted`` is read by ``expect``)."""
        from protocols import world_v1 as wire
        from protocols.mouse_v1 import mouse_control

        deltas = [(0.05 * math.sin(0.3 * (12 * k + i)), 0.02) for i in range(12)]
        return await self.send_event(wire.keys_control({"mode": "state", "held": keys}), mouse_control(deltas))


async def play(p: Player, warmup: int, n: int, lead: int = 2) -> list[Arrival]:
    """Warm-up chunks, then ``n`` chunks with ``lead`` credits kept ahead: after every chunk a
    new keys + mouse event and one credit back (the last ``lead`` chunks need none)."""
    await p.move(["w"], 0)
    await p.credit(warmup)
    for _ in range(warmup):
        await p.next_chunk()
    await p.credit(lead)
    got = []
    for i in range(n):
        got.append(await p.next_chunk())
        await p.move(["w"] if i % 4 else ["w", "d"], i + 1)
        if i < n - lead:
            await p.credit(1)
    return got


async def drain(p: Player) -> None:
    while not p.messages.empty():
        p.messages.get_nowait()


# The players run in a process of their own (``served_sections``), as remote players would: in
# the server's process their reads and JSON would take the interpreter lock from its event loop
# and engine thread and count against the served figures. Times are the client's.
def players(url: str, n: int, image: bytes, warmup: int, chunks: int, fmt: str) -> list[list[dict[str, Any]]]:
    """``n`` players at once (``play``); per player, per timed chunk: header and first-frame
    arrival times, frames, the server's tick time."""
    async def run() -> list[list[Arrival]]:
        ps = await asyncio.gather(*(Player.open(url, f"s{n}-{i}", image, seed=i, fmt=fmt) for i in range(n)))
        try:
            return await asyncio.gather(*(play(p, warmup, chunks) for p in ps))
        finally:
            await asyncio.gather(*(p.close() for p in ps))

    return [[{"t_header": c.t_header, "t_first": c.t_first, "frames": c.frames, "tick_ms": c.header["tick_ms"]}
             for c in got] for got in asyncio.run(run())]


def presses(url: str, image: bytes, warmup: int, n: int, fmt: str) -> list[dict[str, Any]]:
    """Key press to first frame of one ``stream_frames`` player alone: an idle session (no
    credit) gets a keys.v1 + mouse.v1 event and one credit, ``n`` times."""
    async def run() -> list[dict[str, Any]]:
        p = await Player.open(url, "ttff", image, seed=7, stream_frames=True, fmt=fmt)
        rows = []
        try:
            await p.move(["w"], 0)
            await p.credit(warmup)
            for _ in range(warmup):
                await p.next_chunk()
            for i in range(n):
                await drain(p)
                eid, t0 = await p.move(["d"] if i % 2 == 0 else ["a"], i + 1)
                await p.credit(1)
                c = await p.next_chunk()
                if eid not in c.header["applied_event_ids"]:
                    raise RuntimeError(f"event {eid} not in the chunk after it: {c.header}")
                rows.append({"ttff_ms": round(1e3 * (c.t_first - t0), 2),
                             "commit_ms": round(1e3 * (c.t_header - t0), 2), "server_tick_ms": c.header["tick_ms"]})
        finally:
            await p.close()
        return rows

    return asyncio.run(run())


def served_sections(url: str, adapter: Any, args: argparse.Namespace, device: torch.device,
                    result: dict[str, Any], want: Callable[[str], bool],
                    budget_ok: Callable[[str], bool], save: Callable[[], None]) -> None:
    image = first_image(args.height, args.width)
    F = adapter.geometry.frames_per_chunk
    pool = adapter.pipeline.cache.max_sessions
    bare_rows = {r["sessions"]: r for r in (result.get("bare") or {}).get("rows", [])}
    with mp.get_context("spawn").Pool(1) as clients:
        if want("served"):
            out: dict[str, Any] = {"format": args.format, "clients": "one process of their own", "rows": [],
                                   "goals": {"players_at_25_fps": ">= 6 (TAEHV), >= 3 (Wan VAE)",
                                             "served_over_bare": ">= 0.95 at each count"}}
            result["served"] = out
            for n in counts(args.served_sessions, pool, out, budget_ok, "served"):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                got = clients.apply(players, (url, n, image, args.warmup_ticks, args.ticks + 1, args.format))
                periods = [[1e3 * (b["t_header"] - a["t_header"]) for a, b in zip(g, g[1:])] for g in got]
                per_session = [F / (statistics.median(ps) / 1e3) for ps in periods]
                server_ticks = [c["tick_ms"] for g in got for c in g]
                row: dict[str, Any] = {
                    "sessions": n, "chunk_period_ms_median": med([x for ps in periods for x in ps]),
                    "chunk_period_ms_p99": p99([x for ps in periods for x in ps]),
                    "fps_per_session": [round(x, 3) for x in per_session],
                    "fps_slowest_session": round(min(per_session), 3), "fps_total": round(sum(per_session), 3),
                    "server_tick_ms_median": med(server_ticks), "server_tick_ms_p99": p99(server_ticks),
                    "frames_per_chunk": sorted({c["frames"] for g in got for c in g}),
                    "at_least_25_fps_each": min(per_session) >= 25.0}
                if device.type == "cuda":
                    row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
                bare_row = bare_rows.get(n)
                if bare_row is not None:
                    row["bare_fps_per_session"] = bare_row["batched"]["fps_per_session"]
                    row["served_over_bare"] = round(min(per_session) / bare_row["batched"]["fps_per_session"], 4)
                out["rows"].append(row)
                log(f"served N={n}: slowest {row['fps_slowest_session']} fps, period "
                    f"{row['chunk_period_ms_median']} ms, served/bare {row.get('served_over_bare')}")
                save()
            ok = [r["sessions"] for r in out["rows"] if r["at_least_25_fps_each"]]
            out["most_players_at_25_fps"] = max(ok, default=0)

        if want("ttff") and budget_ok("ttff"):
            rows = clients.apply(presses, (url, image, args.warmup_ticks, args.ttff_presses, args.format))
            for i, r in enumerate(rows):
                log(f"ttff {i}: {r['ttff_ms']} ms (tick {r['server_tick_ms']} ms)")
            tt = [r["ttff_ms"] for r in rows]
            result["ttff"] = {"presses": rows, "ttff_ms_median": med(tt), "ttff_ms_max": max(tt) if tt else None,
                              "goal": "key press to first frame on the wire <= 150 ms (stream_frames)",
                              "within_goal": bool(tt) and max(tt) <= 150.0,
                              "how": "an idle session (no credit) gets a keys.v1 + mouse.v1 event and one credit; "
                                     "timed from the event's send to the first binary frame of the chunk applying it"}
            save()


# ------------------------------------------------------------------ kv
def kv_bytes(adapter: Any, sid: str) -> dict[str, Any]:
    """One session's KV now, measured from the tensors, vs ``kv.capacity.session_bytes``."""
    from kv.capacity import session_bytes

    p = adapter.pipeline
    cache, st = p.cache, p.cache.storage
    held = len(cache.table(sid).held)
    block_bytes = sum(t[0].numel() * t[0].element_size() for t in st.k + st.v)
    cross_bytes = sum(t[0].numel() * t[0].element_size() for t in st.cross_k + st.cross_v)
    state_bytes = p.residency.state(sid).nbytes
    measured = held * block_bytes + cross_bytes + state_bytes
    formula = session_bytes(p.geometry)
    return {"held_blocks": held, "block_bytes": block_bytes, "page_bytes_formula": p.geometry.page_bytes,
            "cross_bytes": cross_bytes, "cross_bytes_formula": p.geometry.cross_bytes,
            "state_bytes": state_bytes, "state_bytes_formula": p.geometry.model_state_bytes,
            "session_bytes_measured": measured, "session_bytes_formula": formula,
            "equal_to_the_byte": measured == formula, "session_gib": round(measured / GIB, 4)}


def capacity_at(g: Any, available: int, fraction: float = 0.9) -> dict[str, Any]:
    from kv import plan_capacity
    from kv.capacity import CapacityError, required_bytes

    try:
        plan = plan_capacity(g, available_bytes=available, fraction=fraction)
    except CapacityError as e:
        return {"available_bytes": available, "sessions": 0, "why": str(e)}
    return {"available_bytes": available, "fraction": fraction, "sessions": plan.capacity,
            "required_bytes": required_bytes(g, plan.capacity), "required_1_bytes": plan.required_one_bytes}


def full_size_formula(decoder: str) -> dict[str, Any]:
    """The capacity formula at full size, 352 x 640, bf16, from a model built on ``meta``:
    one session's bytes and the sessions that fit at 0.9 of an 80 and a 141 GiB card after the
    weights (DiT + Wan VAE + the real CLIP tower's 0.63 B parameters, ~1.3 GB)."""
    from kv.capacity import session_bytes
    from models.world.matrix_game.pipeline import session_geometry

    dit, vae, clip = parts(False, "meta", torch.bfloat16)
    taehv = None
    if decoder == "taehv":
        from models.world.taehv import TAEHVDecoder

        with torch.device("meta"):
            taehv = TAEHVDecoder().to(torch.float16)
    g = session_geometry(dit, vae, clip, 352, 640, taehv)
    weights = parameter_bytes(dit) + parameter_bytes(vae) + int(0.632e9 * 2)
    out: dict[str, Any] = {"decoder": decoder, "session_bytes": session_bytes(g), "page_bytes": g.page_bytes,
                           "cross_bytes": g.cross_bytes, "model_state_bytes": g.model_state_bytes,
                           "weights_bytes_estimate": weights}
    for name, gib in (("80_gib", 80), ("141_gib", 141)):
        out[name] = capacity_at(g, gib * GIB - weights)
    return out


def kv_section(adapter: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    sid = "kv"
    for k in range(3):   # the window is full from the second block on; measured after the third
        tick(adapter, [work(adapter, sid, k, 3)], device)
    out: dict[str, Any] = {"steady_session": kv_bytes(adapter, sid)}
    adapter.drop_session(sid)
    g = adapter.pipeline.geometry
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] + adapter.pipeline.cache.storage.nbytes()
        out["this_device"] = capacity_at(g, free)
        out["this_device"]["note"] = "free memory after the weights, the pool counted as free"
    out["full_size_formula"] = full_size_formula(args.decoder)
    return out


# ------------------------------------------------------------------ main
def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals against what this run measured (None: not measured)."""
    bare_rows = {r["sessions"]: r for r in (result.get("bare") or {}).get("rows", [])}
    served = result.get("served") or {}
    out: dict[str, Any] = {"decoder": result.get("decoder")}
    one = bare_rows.get(1)
    out["alone_fps"] = one["batched"]["fps_per_session"] if one else None
    out["alone_at_least_60_fps"] = None if one is None else one["batched"]["fps_per_session"] >= 60.0
    eight = bare_rows.get(8)
    if eight is not None:
        b, s = eight["batched"], eight["one_at_a_time"]
        out["batched_over_one_at_a_time_at_8"] = eight["batched_over_one_at_a_time"]
        out["at_8_gain_at_least_1_3_and_lower_p99"] = (eight["batched_over_one_at_a_time"] >= 1.3
                                                        and b["round_ms_p99"] < s["round_ms_p99"])
    out["most_players_at_25_fps_served"] = served.get("most_players_at_25_fps")
    ratios = [r["served_over_bare"] for r in served.get("rows", []) if "served_over_bare" in r]
    out["served_over_bare_min"] = min(ratios) if ratios else None
    out["ttff_ms_max"] = (result.get("ttff") or {}).get("ttff_ms_max")
    return out


def sessions_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    global START
    START = time.perf_counter()
    ap = BenchArguments(__doc__, SECTIONS, size=(352, 640), tiny=(32, 64))
    ap.add_argument("--decoder", choices=("wan", "taehv"), default="wan")
    ap.add_argument("--sessions", type=sessions_list, default=None,
                    help="bare session counts, e.g. 1,2,4 (default 1,2,4,8,16,32; 1,2 with --tiny)")
    ap.add_argument("--served-sessions", type=sessions_list, default=None,
                    help="served session counts (default 1,2,4,8,16; 1,2 with --tiny)")
    ap.add_argument("--warmup-ticks", type=int, default=2, help="the window is full from the second block on")
    ap.add_argument("--ticks", type=int, default=3, help="timed ticks per count and mode")
    ap.add_argument("--ttff-presses", type=int, default=5)
    ap.add_argument("--format", default="rgb8", choices=("rgb8", "jpeg"), help="world.v1 frame format served")
    ap.add_argument("--batch-wait-ms", type=float, default=None, help="engine returner wait (default: the server's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU runs)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip a section (or count) that would start after this")
    ap.add_argument("--profile-max-sessions", type=int, default=8,
                    help="count CUDA kernel launches (one more round, profiled) up to this many sessions")
    ap.add_argument("--bare-share", type=float, default=0.6,
                    help="bare's share of the budget: a count whose forecast would pass it is not run")
    args = ap.parse_args()
    args.sessions = args.sessions or ([1, 2] if args.tiny else list(GPU_SESSIONS))
    args.served_sessions = args.served_sessions or ([1, 2] if args.tiny else list(GPU_SERVED_SESSIONS))
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result: dict[str, Any] = {
        "benchmark": "Matrix-Game 2.0 at full size: N sessions batched vs one at a time, served world.v1 players, "
                     "key press to first frame, KV bytes and capacity (issue 49)",
        "command": " ".join(["python3", "-m", "bench.world.bench_matrix_game", *sys.argv[1:]]),
        "env": environment(device, PACKAGES), "device": str(device), "tiny": args.tiny, "decoder": args.decoder,
        "budget_s": args.budget_s, "skipped": {}, "errors": {},
    }
    run = Sections(result, args.out, args.only, args.budget_s, START, log)
    save, budget_ok, section, want = run.save, run.budget_ok, run.section, run.want

    log("building the model (random weights on the device) ...")
    adapter, info = build(args, device)
    result["model"] = info
    log(f"built in {info['build_s']} s: transformer {info['transformer_params'] / 1e9:.2f} B params, "
        f"pool for {info['pool_sessions']} sessions ({info['pool_bytes'] / GIB:.2f} GiB)")
    save()
    clock = Clock(adapter.pipeline, device)
    # On a fresh thread, as the engine runs the model on its own thread.
    section("bare", lambda: on_spent_thread(bare, adapter, clock, args, device, result, budget_ok, save))
    section("kv", lambda: on_spent_thread(kv_section, adapter, args, device))
    served = [name for name in ("served", "ttff") if want(name)]
    if served and not budget_ok(served[0]):
        for name in served[1:]:
            budget_ok(name)
    elif served:
        pool = adapter.pipeline.cache.max_sessions
        with serving(adapter, device, args.batch_wait_ms, max_batch=pool, max_sessions_per_client=pool + 2) as (addr, _):
            log(f"serving on {addr}")
            run.attempt("served_sections", lambda: served_sections(
                f"ws://{addr}/v1/realtime/world", adapter, args, device, result, want, budget_ok, save))
    result["residency_end"] = adapter.pipeline.residency.metrics()
    result["memory_end"] = device_memory(device)
    result["summary"] = summary(result)
    save()
    print(json.dumps({k: result.get(k) for k in ("summary", "errors", "skipped", "elapsed_s")}, indent=1), flush=True)


if __name__ == "__main__":
    main()

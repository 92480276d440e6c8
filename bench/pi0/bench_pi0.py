"""Native pi0 at full size (random bf16 weights made on the GPU), eager vs fast, bare vs served, one run:

1. bare: ``Pi0Policy.infer_batch`` (host prep, upload, prefix, Euler loop, download) at
   1, 8 and 32 robots, **eager** (no graphs, eager layers) beside **fast** (the served
   default: the whole call as one CUDA graph per bucket over torch.compile'd layers),
   with the fast path's prefix vs action-expert split from CUDA events, the fast path at
   every batch bucket, and at one robot graphs without compiled layers (what compiling adds)
   and the fast path with cuBLAS for the expert's matmuls (what skinny_linear.py adds);
2. served: the real server (uvicorn + the engine) on loopback and robots that are
   separate processes with the real ``openpi-client`` (bench/pi0/robots.py): one robot
   (vs bare fast), then 8 and 32 robots batched (``max_batch`` 32) and one at a time
   (the same weights behind a ``max_batch`` 1 adapter); at one robot also where served - bare
   goes (the forward timed on the engine thread, the client's packing, and a stand-in policy
   that sleeps the bare call with pi0's request);
3. memory: weights, and per batch bucket the static K/V buffers plus the peak of a call.

    python -m bench.pi0.bench_pi0 --device cuda --out bench/results/pi0_h200.json
    python -m bench.pi0.bench_pi0 --tiny --seconds 0.5 --out /tmp/pi0_cpu.json   # CPU smoke test

Progress goes to stderr; every phase is bounded by --seconds / --calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from bench.pi0.robots import make_obs, pct  # noqa: E402
from bench.report import emit  # noqa: E402
from models.policy.base import PolicyWork  # noqa: E402
from models.policy.dummy import DummyPolicy  # noqa: E402
from models.policy.pi0.config import GemmaSpec, VisionSpec, full_size  # noqa: E402
from models.policy.pi0.inputs import PromptTokenizer, Stats  # noqa: E402
from models.policy.pi0.layout import write_tokenizer  # noqa: E402
from models.policy.pi0 import skinny_linear  # noqa: E402
from models.policy.pi0.policy import Pi0Policy  # noqa: E402
from models.policy.pi0.weights import build_random  # noqa: E402
from protocols import openpi as wire  # noqa: E402

PATH = "/v1/realtime/robot/openpi"


def log(msg: str) -> None:
    print(f"[pi0_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _Timed:
    """Records each forward's batch size (what the engine actually batched) and its time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: list[int] = []
        self.forward_ms: list[float] = []

    def infer_batch(self, works):  # type: ignore[no-untyped-def]
        self.sizes.append(len(works))
        t = time.perf_counter()
        out = super().infer_batch(works)  # type: ignore[misc]
        self.forward_ms.append((time.perf_counter() - t) * 1000.0)
        return out


class CountingPi0(_Timed, Pi0Policy):
    """The pi0 policy, timed (``_Timed``)."""


class StandIn(_Timed, DummyPolicy):
    """pi0's metadata and one robot's bare call time as a sleep: what serving adds to a forward
    that does not compete for the CPU (the forward's size and request bytes are pi0's)."""


def tiny_config():
    return full_size(
        image_resolution=(28, 28), chunk_size=50, tokenizer_max_length=16,
        vlm=GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=2, num_kv_heads=1, head_dim=32),
        expert=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=32),
        vision=VisionSpec(hidden=32, intermediate=64, layers=2, heads=2, patch=14), vocab_size=128,
    )


def make_policy(model, tok, dev, max_batch: int, name: str, use_graphs: bool | None = None,
                compile: bool | None = None, weight_stream: bool = True) -> CountingPi0:
    p = CountingPi0(model, tok, state_stats=Stats("IDENTITY"), action_stats=Stats("IDENTITY"), device=dev,
                    max_batch=max_batch, name=name, use_graphs=use_graphs, compile=compile,
                    weight_stream=weight_stream)
    return p


def works_for(policy: Pi0Policy, n: int, size: int, tag: str) -> list[PolicyWork]:
    out = []
    for i in range(n):
        o = make_obs(i, list(policy.client_keys), size, policy.cfg.state_dim)
        obs = wire.validate_observation(o, policy.metadata)
        out.append(PolicyWork(f"{tag}/{i}", f"{tag}/{i}:0", obs))
    return out


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time(policy: Pi0Policy, works: list[PolicyWork], calls: int, seconds: float, dev: torch.device,
          split: bool) -> tuple[list[float], list[float], list[float]]:
    policy.runner.time_split = split
    policy.infer_batch(works)  # capture / warm
    lat, prefix, expert = [], [], []
    start = time.perf_counter()
    while len(lat) < calls and time.perf_counter() - start < seconds:
        sync(dev)
        t = time.perf_counter()
        policy.infer_batch(works)
        lat.append((time.perf_counter() - t) * 1000.0)
        if split and policy.runner.last_split_ms is not None:
            prefix.append(policy.runner.last_split_ms[0])
            expert.append(policy.runner.last_split_ms[1])
    policy.runner.time_split = False
    return lat, prefix, expert


def bare(policy: Pi0Policy, n: int, size: int, calls: int, seconds: float, dev: torch.device,
         split: bool = True) -> dict[str, Any]:
    """The adapter's forward alone: as served (whole call graphed on CUDA), then split."""
    works = works_for(policy, n, size, f"bare{n}")
    lat, _, _ = _time(policy, works, calls, seconds, dev, split=False)
    out: dict[str, Any] = {"robots": n, "call_ms": pct(lat), "calls_per_s": round(n * 1000.0 / float(np.median(lat)), 2)}
    if dev.type == "cuda" and split and policy.runner.use_graphs:
        # The split needs an event between the two halves: prefix eager, expert loop graphed.
        lat2, prefix, expert = _time(policy, works, max(10, calls // 4), seconds / 2, dev, split=True)
        out["split_run"] = {"note": "prefix ungraphed (its layers as in the fast path) + expert loop as a CUDA "
                                    "graph, CUDA events between them",
                            "call_ms": pct(lat2), "prefix_ms": pct(prefix), "expert_loop_ms": pct(expert)}
    return out


def agreement(fast: Pi0Policy, eager: Pi0Policy, sizes: list[int], size: int) -> dict[str, Any]:
    """The same robots (same noise) through both paths: how far the fast actions are from eager."""
    out = {}
    for n in sizes:
        works = works_for(fast, n, size, f"agree{n}")
        a = np.stack([r["actions"] for r in fast.infer_batch(works)])
        b = np.stack([r["actions"] for r in eager.infer_batch(works)])
        out[str(n)] = {"max_abs_diff": round(float(np.abs(a - b).max()), 5),
                       "eager_max_abs": round(float(np.abs(b).max()), 4),
                       "rel_rms_diff": round(float(np.sqrt(((a - b) ** 2).mean() / max((b ** 2).mean(), 1e-12))), 5)}
    return out


def memory(policy: Pi0Policy, size: int, dev: torch.device) -> dict[str, Any]:
    if dev.type != "cuda":
        return {}
    out = {}
    for b in policy.runner.buckets:
        works = works_for(policy, b, size, f"mem{b}")
        policy.infer_batch(works)
        bk = policy.runner._buckets[b]
        static = sum(t.numel() * t.element_size() for t in (bk.kv, bk.prefix_pad, bk.state, bk.noise))
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        policy.infer_batch(works)
        torch.cuda.synchronize(dev)
        out[str(b)] = {"static_kv_and_inputs_mib": round(static / 2**20, 1),
                       "call_peak_above_resident_mib": round((torch.cuda.max_memory_allocated(dev) - base) / 2**20, 1)}
    return out


def served(policy: CountingPi0 | StandIn, robots: int, seconds: float, size: int,
           batch_wait_ms: float, gil_hand_off: bool = True) -> dict[str, Any]:
    from realtime.server.app import build_app
    from realtime.server.config import EngineConfig, LimitsConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
    from realtime.server.inventory import Inventory
    from realtime.server.server import serve_in_thread

    device = str(getattr(policy, "device", "cpu"))  # the stand-in has none: the engine's default
    config = ServerConfig(engine=EngineConfig(device=device, batch_wait_ms=batch_wait_ms, gil_hand_off=gil_hand_off),
                          world=WorldConfig(models=()), policy=PolicyConfig(policy=""), tts=TTSConfig(enabled=False),
                          limits=LimitsConfig(max_sessions_per_client=0))  # every robot on loopback
    inventory = Inventory()
    inventory.adapters[policy.name] = policy
    policy.sizes, policy.forward_ms = [], []  # this run's forwards only
    with serve_in_thread(build_app(config, inventory)) as addr:
        cmd = [sys.executable, "-m", "bench.pi0.robots", "--uri", f"ws://{addr}{PATH}", "--robots", str(robots),
               "--seconds", str(seconds), "--cameras", ",".join(policy.metadata.image_keys), "--size", str(size),
               "--state", str(policy.metadata.state_dim)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=seconds + 240)
    if proc.returncode != 0:
        raise RuntimeError(f"robots failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    sizes = np.asarray(policy.sizes or [0])
    result["forwards"] = int(sizes.size)
    result["mean_batch"] = round(float(sizes.mean()), 2)
    result["server_forward_ms"] = pct(policy.forward_ms)  # infer_batch on the engine thread, as served
    return result


def versions() -> dict[str, str]:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
           "transformers": transformers.__version__}
    for name in ("openpi_client", "uvicorn", "starlette", "websockets", "tokenizers", "safetensors"):
        try:
            from importlib.metadata import version

            out[name] = version(name.replace("_", "-"))
        except Exception:  # noqa: BLE001 - a version is a nicety
            out[name] = "?"
    return out


def hardware(dev: torch.device) -> dict[str, Any]:
    hw: dict[str, Any] = {"cpu_cores": os.cpu_count(), "machine": platform.machine()}
    if dev.type == "cuda":
        prop = torch.cuda.get_device_properties(dev)
        hw.update(gpu=prop.name, gpu_memory_gib=round(prop.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return hw


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()

    def save(res: dict[str, Any]) -> None:
        if args.out:
            emit(res, args.out, echo=False)

    dev = torch.device(args.device)
    cfg = tiny_config() if args.tiny else full_size()
    size = cfg.image_resolution[0]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with tempfile.TemporaryDirectory(prefix="pi0_tok_") as tok_dir:  # the tokenizer is read into memory
        write_tokenizer(tok_dir, ["pick up the red block", "warm up", "stack the blocks"], vocab_size=64)
        tok = PromptTokenizer(tok_dir, cfg.tokenizer_max_length)
    log(f"building pi0 ({'tiny' if args.tiny else 'full size'}) on {dev} in {dtype}")
    t = time.perf_counter()
    model = build_random(cfg, device=dev, dtype=dtype).eval()
    sync(dev)
    build_s = time.perf_counter() - t
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    resident = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    params = sum(p.numel() for p in model.parameters())
    log(f"{params / 1e9:.3f} B parameters, {weights_bytes / 2**30:.2f} GiB, built in {build_s:.1f} s")

    # Fast = the served default on the device (graphs + compiled layers on CUDA). On CPU
    # (--tiny) graphs do not exist, so "fast" compiles the layers only when --cpu-compile.
    # All policies exist before any graph is captured (they share the model's fused tensors).
    cpu_compile = True if (dev.type != "cuda" and args.cpu_compile) else None
    fast = make_policy(model, tok, dev, args.max_batch, "pi0", compile=cpu_compile)
    single = make_policy(model, tok, dev, 1, "pi0-one-at-a-time", compile=cpu_compile)
    eager = make_policy(model, tok, dev, args.max_batch, "pi0-eager", use_graphs=False, compile=False)
    graphs_only = make_policy(model, tok, dev, 1, "pi0-graphs-eager-layers", compile=False)
    cublas = make_policy(model, tok, dev, 1, "pi0-cublas", compile=cpu_compile, weight_stream=False)  # fast, cuBLAS

    res: dict[str, Any] = {
        "benchmark": "pi0_native",
        "complete": False,  # rewritten after every phase, so a run cut short still leaves its figures
        "command": " ".join([os.path.basename(sys.executable), "-m", "bench.pi0.bench_pi0", *sys.argv[1:]]),
        "hardware": hardware(dev), "versions": versions(),
        "model": {"config": "tiny" if args.tiny else "pi0 full size (PaliGemma 3B + Gemma 300M expert)",
                  "weights": "random (built on the device, no checkpoint)", "dtype": str(dtype).removeprefix("torch."),
                  "parameters": params, "cameras": len(cfg.image_features), "prefix_tokens": cfg.prefix_len,
                  "suffix_tokens": cfg.suffix_len, "chunk": [cfg.chunk_size, cfg.max_action_dim],
                  "steps": cfg.num_inference_steps, "build_s": round(build_s, 2)},
        "paths": {
            "eager": "no CUDA graphs, eager layers (Pi0Runner use_graphs=False, compile=False)",
            "graphs_eager_layers": "prefix + Euler loop as one CUDA graph, eager layers (compile=False)",
            "fast": "served default: prefix + Euler loop as one CUDA graph per bucket, torch.compile'd layers",
            "buckets": list(fast.runner.buckets),
        },
        "request_bytes": len(wire.pack(make_obs(0, list(fast.client_keys), size, cfg.state_dim))),
        "memory": {"weights_gib": round(weights_bytes / 2**30, 3),
                   "resident_after_build_gib": None if resident is None else round(resident / 2**30, 3)},
    }
    sizes = [n for n in (1, 8, 32) if n <= args.max_batch]
    # Cheapest first: eager and graphs-with-eager-layers need no compiler.
    log("bare eager")
    res["bare_eager"] = {str(n): bare(eager, n, size, args.calls, args.seconds, dev, split=False) for n in sizes}
    save(res)
    t = time.perf_counter()
    graphs_only.warmup()
    res["paths"]["graphs_eager_layers_warmup_s"] = round(time.perf_counter() - t, 1)
    res["bare_graphs_eager_layers_1"] = bare(graphs_only, 1, size, args.calls, args.seconds, dev, split=False)
    save(res)
    t = time.perf_counter()
    fast.warmup()
    single.warmup()
    warm_s = time.perf_counter() - t
    res["paths"].update(fast_layers_compiled=fast.runner.fns.compiled, fast_warmup_s=round(warm_s, 1))
    log(f"warm-up (compile + graph capture for buckets {fast.runner.buckets}) {warm_s:.1f} s; "
        f"layers {'compiled' if fast.runner.fns.compiled else 'eager'}")
    cublas.warmup()
    res["bare_fast_cublas_1"] = bare(cublas, 1, size, args.calls, args.seconds, dev, split=False)
    res["skinny_linear_tuning"] = skinny_linear.tuning_report()
    res["fast_vs_eager"] = agreement(fast, eager, [n for n in (1, 8) if n <= args.max_batch], size)
    log(f"fast vs eager: {json.dumps(res['fast_vs_eager'])}")
    log("bare fast")
    res["bare"] = {str(n): bare(fast if n > 1 else single, n, size, args.calls, args.seconds, dev) for n in sizes}
    save(res)
    res["bare_fast_per_bucket"] = {
        str(b): {k: v for k, v in bare(fast, b, size, args.calls, args.seconds / 2, dev, split=False).items()
                 if k in ("call_ms", "calls_per_s")}
        for b in fast.runner.buckets}
    log("bare p50 ms: eager " + json.dumps({k: v["call_ms"]["p50"] for k, v in res["bare_eager"].items()})
        + ", fast " + json.dumps({k: v["call_ms"]["p50"] for k, v in res["bare"].items()})
        + f", graphs with eager layers (1) {res['bare_graphs_eager_layers_1']['call_ms']['p50']}")
    res["memory"]["per_batch"] = memory(fast, size, dev)
    if dev.type == "cuda":
        res["memory"]["peak_gib"] = round(torch.cuda.max_memory_reserved(dev) / 2**30, 2)
    save(res)

    fleets: dict[str, Any] = {}
    log("served: one robot")
    fleets["1"] = {"batched": served(fast, 1, args.seconds, size, args.batch_wait_ms)}
    # The same robot with the engine's GIL hand-off off (realtime/engine/overlap.py, "GIL hand-off"): A/B in one run.
    fleets["1"]["no_gil_hand_off"] = served(fast, 1, args.seconds, size, args.batch_wait_ms, gil_hand_off=False)
    log(f"one robot p50 ms: {fleets['1']['batched']['latency_ms']['p50']} with the GIL hand-off, "
        f"{fleets['1']['no_gil_hand_off']['latency_ms']['p50']} without")
    if "1" in res["bare"]:
        # Where served - bare goes: the same request and wait with no GPU work and no CPU
        # competition (a sleep of the bare call), and the served forward timed on the engine thread.
        stand_in = StandIn(metadata=fast.metadata, infer_ms=res["bare"]["1"]["call_ms"]["p50"], max_batch=1,
                           name="pi0-stand-in")
        one = fleets["1"]["batched"]
        fleets["1"]["stand_in"] = served(stand_in, 1, args.seconds, size, args.batch_wait_ms)
        fleets["1"]["split_ms"] = {
            "served_p50": one["latency_ms"]["p50"], "bare_p50": res["bare"]["1"]["call_ms"]["p50"],
            "served_forward_p50": one["server_forward_ms"]["p50"],
            "stand_in_served_p50": fleets["1"]["stand_in"]["latency_ms"]["p50"],
            "stand_in_forward_p50": fleets["1"]["stand_in"]["server_forward_ms"]["p50"],
            "client_pack_p50": one["client_pack_ms"]["p50"],
            "note": "served - served_forward: the protocol, hand-offs and client; served_forward - bare: what "
                    "serving costs the forward itself (CPU / GIL competition); the stand-in's served - forward "
                    "is the protocol's share for these request bytes alone",
        }
        log(f"one robot split: {json.dumps(fleets['1']['split_ms'])}")
    for n in sizes[1:]:
        log(f"served: {n} robots, batched then one at a time")
        fleets[str(n)] = {"batched": served(fast, n, args.seconds, size, args.batch_wait_ms),
                          "one_at_a_time": served(single, n, args.seconds, size, args.batch_wait_ms)}
        f = fleets[str(n)]
        f["speedup"] = round(f["batched"]["calls_per_s"] / max(f["one_at_a_time"]["calls_per_s"], 1e-9), 2)
        log(f"  {n}: {f['batched']['calls_per_s']} vs {f['one_at_a_time']['calls_per_s']} calls/s "
            f"({f['speedup']}x), p99 {f['batched']['latency_ms']['p99']} ms")
        res["served"] = fleets
        save(res)
    res["served"] = fleets
    one_served = fleets["1"]["batched"]["latency_ms"]["p50"]
    one_bare = res["bare"]["1"]["call_ms"]["p50"]
    res["goals"] = {
        "one_robot_served_p50_ms": one_served, "goal_one_robot_ms": 20.0,
        "one_robot_bare_fast_p50_ms": one_bare,
        "one_robot_bare_fast_cublas_p50_ms": res["bare_fast_cublas_1"]["call_ms"]["p50"], "one_robot_bare_eager_p50_ms": res["bare_eager"]["1"]["call_ms"]["p50"],
        "served_over_bare": round(one_served / one_bare, 3), "goal_ratio": 1.1,
        **{f"speedup_{n}": fleets[str(n)]["speedup"] for n in sizes[1:]}, "goal_speedup": 4.0,
        **({"p99_32_batched_ms": fleets["32"]["batched"]["latency_ms"]["p99"]} if "32" in fleets else {}),
    }
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    res["complete"] = True
    log(f"goals: {json.dumps(res['goals'])} (whole run {res['wall_s']} s)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny config (CPU smoke test)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--batch-wait-ms", type=float, default=20.0)
    ap.add_argument("--max-batch", type=int, default=32, help="the batched adapter's max_batch (robots up to 32)")
    ap.add_argument("--cpu-compile", action="store_true", help="on CPU, compile the fast path's layers (slow)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res = run(args)
    emit(res, args.out, echo=not args.out, log=log)


if __name__ == "__main__":
    main()

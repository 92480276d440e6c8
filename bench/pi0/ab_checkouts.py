"""pi0's bare call, this checkout against another one, on one GPU in one run (rounds alternating).

A GPU's speed differs from host to host and from hour to hour, so a change to the model's
GPU path is judged by a before / after measured side by side. Each checkout gets a worker
process that imports ``models/`` from that checkout, builds the same full-size random bf16
pi0 (seed 0), wraps it in ``Pi0Policy`` (the served default: the whole call one CUDA graph
per bucket over the compiled layers) and warms every bucket up. Then the parent asks the
workers in turn, order flipped every round, to time ``infer_batch`` (host preparation,
upload, the graph, download) at each robot count for ``--seconds``; only one worker
computes at a time. The figure per checkout and count is the median over rounds of each
round's p50; the ratio is this checkout's over the baseline's.

    mkdir .base && git archive HEAD models protocols kv | tar -x -C .base    # the code before the change
    python3 -m bench.pi0.ab_checkouts --baseline .base --baseline-label "$(git rev-parse --short HEAD)" \
        --out bench/results/pi0_ab.json
    python3 -m bench.pi0.ab_checkouts --baseline .base --device cpu --tiny --seconds 0.2   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log(msg: str) -> None:
    print(f"[pi0_ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- worker (in the checkout's code)
def worker(repo: str, max_batch: int, device: str, tiny: bool) -> None:
    sys.path.insert(0, repo)  # models/ and protocols/ from the checkout under test
    if REPO not in sys.path:  # bench_pi0's helpers from this one when the checkout has no bench/
        sys.path.append(REPO)
    import numpy as np
    import torch

    from bench.pi0.bench_pi0 import tiny_config, works_for
    from models.policy.pi0.config import full_size
    from models.policy.pi0.inputs import PromptTokenizer, Stats
    from models.policy.pi0.layout import write_tokenizer
    from models.policy.pi0.policy import Pi0Policy
    from models.policy.pi0.weights import build_random

    dev = torch.device(device)
    cfg = tiny_config() if tiny else full_size()
    tok_dir = tempfile.mkdtemp(prefix="pi0_tok_")
    write_tokenizer(tok_dir, ["pick up the red block", "warm up", "stack the blocks"], vocab_size=64)
    model = build_random(cfg, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    policy = Pi0Policy(model, PromptTokenizer(tok_dir, cfg.tokenizer_max_length), state_stats=Stats("IDENTITY"),
                       action_stats=Stats("IDENTITY"), device=dev, max_batch=max_batch)
    t0 = time.perf_counter()
    policy.warmup()
    warm_s = time.perf_counter() - t0

    def works(n: int) -> list:
        return works_for(policy, n, cfg.image_resolution[0], "ab")

    first = policy.infer_batch(works(1))[0]["actions"]
    print(json.dumps({"ready": True, "warm_s": round(warm_s, 1), "compiled": policy.runner.fns.compiled,
                      "actions_checksum": float(np.abs(first).sum())}), flush=True)
    for line in sys.stdin:
        n, seconds = json.loads(line)
        batch = works(n)
        policy.infer_batch(batch)
        lat: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            policy.infer_batch(batch)
            lat.append((time.perf_counter() - t) * 1000.0)
        print(json.dumps({"p50": statistics.median(lat), "n": len(lat)}), flush=True)


# ---------------------------------------------------------------- parent
class Worker:
    def __init__(self, label: str, repo: str, max_batch: int, device: str, tiny: bool) -> None:
        self.label = label
        args = [sys.executable, os.path.abspath(__file__), "--role", "worker", "--repo", repo,
                "--max-batch", str(max_batch), "--device", device] + (["--tiny"] if tiny else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=repo)

    def read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: worker exited ({self.proc.wait()})")
        return json.loads(line)

    def time(self, n: int, seconds: float) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps([n, seconds]) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="the other checkout (a git worktree of the commit before the change)")
    ap.add_argument("--baseline-label", default=None, help="what the baseline is (a commit)")
    ap.add_argument("--robots", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny config (the CPU smoke test)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    ap.add_argument("--repo", help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "worker":
        worker(args.repo, args.max_batch, args.device, args.tiny)
        return
    if not args.baseline:
        ap.error("--baseline is required")
    max_batch = max(args.robots)
    base_rev = args.baseline_label or subprocess.run(["git", "-C", args.baseline, "rev-parse", "--short", "HEAD"],
                                                     capture_output=True, text=True).stdout.strip()
    workers = [Worker(label, repo, max_batch, args.device, args.tiny)
               for label, repo in (("this", REPO), ("baseline", os.path.abspath(args.baseline)))]
    ready = {}
    try:
        for w in workers:  # both build and warm up at once
            ready[w.label] = w.read()
            log(f"{w.label} ready: {ready[w.label]}")
        rounds: dict[str, dict[int, list[float]]] = {w.label: {n: [] for n in args.robots} for w in workers}
        for r in range(args.rounds):
            for w in (workers if r % 2 == 0 else workers[::-1]):
                for n in args.robots:
                    rounds[w.label][n].append(round(w.time(n, args.seconds)["p50"], 3))
            log(f"round {r}: " + ", ".join(f"{lab} {v[n][-1]:.3f} ms @{n}" for lab, v in rounds.items()
                                            for n in args.robots))
    finally:
        for w in workers:
            w.stop()
    import torch

    from bench.report import emit

    res = {
        "benchmark": "pi0_ab_checkouts",
        "command": " ".join(["python3", "-m", "bench.pi0.ab_checkouts", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch": torch.__version__,
        "baseline": base_rev, "workers": ready,
        "rounds_p50_ms": {lab: {str(n): v for n, v in per.items()} for lab, per in rounds.items()},
        "p50_ms": {lab: {str(n): statistics.median(v) for n, v in per.items()} for lab, per in rounds.items()},
    }
    res["ratio_this_over_baseline"] = {str(n): round(res["p50_ms"]["this"][str(n)] / res["p50_ms"]["baseline"][str(n)], 4)
                                       for n in args.robots}
    emit(res, args.out)


if __name__ == "__main__":
    main()

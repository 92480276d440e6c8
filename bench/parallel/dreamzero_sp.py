"""DreamZero on 2 GPUs against 1 (issue 51, run 3; bench/multi_gpu.sh step ``dreamzero-2``).

    python -m bench.parallel.dreamzero_sp --checkpoint DIR --tokenizer DIR --out OUT/multi_gpu_dreamzero_2.json
    python -m bench.parallel.dreamzero_sp --cpu --out /tmp/dreamzero_2.json     # CPU rehearsal, tiny checkpoint

First the probe: a ``realtime serve`` with the tiny DreamZero checkpoint on CPU (seconds). Its
``/v1/models`` entry for ``dreamzero`` says whether the model runs over several ranks at all
(``sequence_parallel``, as lingbot's does; ``split`` says how); an entry without it has no such
path, ``realtime serve --sequence-parallel 2`` would only run it on rank 0, and the 2-GPU run is
skipped with that reason in the JSON. Whether the entry takes ``cfg_parallel=1`` (the two CFG
branches on two ranks, instead of every rank half the heads) its own option check answers.

Then, where a checkpoint is at hand (``--checkpoint``/``--tokenizer``, or ``DREAMZERO_CKPT`` and
``DREAMZERO_TOKENIZER``; the tiny one with ``--cpu``), one robot session through the real
``openpi-client`` on ``realtime serve --policy dreamzero=...`` for each variant: ``1`` rank, and
where the probe found them ``2-heads`` (``--sequence-parallel 2``) and ``2-cfg`` (the same with
``cfg_parallel=1``). After ``--warmup`` calls, ``--calls`` timed ones (the window restarts every
4 calls, so 8 span two): each call's round trip and the policy's own ``infer_ms``. The faster
2-rank variant over 1 rank is the figure (goal <= 0.6). A variant that fails is its row's error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.parallel.lingbot_sp import models_entry
from bench.parallel.record import step_report, wait_gpus_idle
from bench.report import emit
from deploy.server_process import ServerProcess

GOAL = 0.6
PATH = "/v1/realtime/robot/openpi"
START = time.monotonic()


def log(msg: str) -> None:
    print(f"[dreamzero_sp {time.monotonic() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def tiny_folders(root: Path) -> tuple[str, str]:
    """The tests' tiny DreamZero-DROID checkpoint and tokenizer under ``root``."""
    from models.policy.dreamzero.config import TINY_DROID
    from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer

    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))


def sequence_parallel_of(entry: dict[str, Any]) -> int | None:
    """The rank count the entry says it runs over, or None when it says nothing (no such path)."""
    value = entry.get("sequence_parallel")
    return value if isinstance(value, int) else None


def cfg_option_taken(tokenizer: str) -> bool:
    """Whether the entry takes ``cfg_parallel=1`` (the two CFG branches on two ranks); its own
    option check answers, as ``realtime serve`` asks it before loading anything."""
    from models.factory import FactoryError, validate

    try:
        validate(f"dreamzero=/x?tokenizer={tokenizer}&cfg_parallel=1", kind="policy")
    except (FactoryError, ValueError):
        return False
    return True


def probe(folders: tuple[str, str]) -> dict[str, Any]:
    """Does the dreamzero entry split over ranks, and how? Its /v1/models entry says whether it
    runs split at all (``sequence_parallel``, and ``split``: heads or cfg); its option check
    whether it takes the CFG split."""
    policy = f"dreamzero={folders[0]}?tokenizer={folders[1]}"
    with ServerProcess(models="tiny", policy=policy, device="cpu", start_timeout_s=180) as server:
        entry = models_entry(server.addr, "dreamzero")
    sp = sequence_parallel_of(entry)
    return {"entry_keys": sorted(entry), "sequence_parallel": sp, "split": entry.get("split"),
            "heads_split": sp is not None, "cfg_split": sp is not None and cfg_option_taken(folders[1])}


@dataclass(frozen=True)
class Variant:
    """One way to serve the policy: its name, rank count and the entry's extra options."""

    name: str
    ranks: int
    options: str = ""          # appended to the entry's query
    split: str | None = None   # what /v1/models must say it runs as


def variants(found: dict[str, Any]) -> list[Variant]:
    out = [Variant("1", 1)]
    if found["heads_split"]:
        out.append(Variant("2-heads", 2, split="heads"))
    if found["cfg_split"]:
        out.append(Variant("2-cfg", 2, "&cfg_parallel=1", split="cfg"))
    return out


def measure(args: argparse.Namespace, folders: tuple[str, str], v: Variant) -> dict[str, Any]:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from models.policy.dreamzero.observation import droid_observation

    policy = f"dreamzero={folders[0]}?tokenizer={folders[1]}{v.options}"
    serve_args = ["--sequence-parallel", str(v.ranks)]
    row: dict[str, Any] = {"variant": v.name, "ranks": v.ranks,
                           "serve": ["realtime", "serve", "--models", "tiny", "--policy", policy, "--no-tts",
                                     "--device", args.device, *serve_args]}
    row["waited_for_idle_gpus_s"] = wait_gpus_idle()
    log(f"{v.name}: starting ...")
    started = time.monotonic()
    with ServerProcess(models="tiny", policy=policy, device=args.device, start_timeout_s=args.start_timeout,
                       serve_args=serve_args) as server:
        row["start_s"] = round(time.monotonic() - started, 1)
        entry = models_entry(server.addr, "dreamzero")
        row["reported"] = {"sequence_parallel": sequence_parallel_of(entry), "split": entry.get("split")}
        if v.ranks > 1 and (row["reported"]["sequence_parallel"], row["reported"]["split"]) != (v.ranks, v.split):
            raise RuntimeError(f"/v1/models says {row['reported']}, asked {v.ranks} ranks split by {v.split}")
        robot = WebsocketClientPolicy(host=f"ws://{server.addr}{PATH}")
        try:
            rtt, infer = [], []
            for call in range(args.warmup + args.calls):
                t = time.perf_counter()
                reply = robot.infer(droid_observation(7, call))
                if call >= args.warmup:
                    rtt.append(1e3 * (time.perf_counter() - t))
                    infer.append(float(reply["policy_timing"]["infer_ms"]))
            row["action_chunk_shape"] = list(np.asarray(reply["actions"]).shape)
            row["actions_finite"] = bool(np.isfinite(reply["actions"]).all())
        finally:
            robot._ws.close()
        row["server_problems"] = server.problems()[:5]
    row.update(call_ms=[round(x, 2) for x in rtt], call_ms_median=round(statistics.median(rtt), 2),
               policy_infer_ms=[round(x, 2) for x in infer], policy_infer_ms_median=round(statistics.median(infer), 2))
    log(f"{v.name}: call {row['call_ms_median']} ms (policy {row['policy_infer_ms_median']} ms)")
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="rehearse on CPU with the tiny checkpoint")
    parser.add_argument("--checkpoint", default=os.environ.get("DREAMZERO_CKPT"))
    parser.add_argument("--tokenizer", default=os.environ.get("DREAMZERO_TOKENIZER"))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--start-timeout", type=float, default=400.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="dreamzero-sp-") as tmp:
        run(args, tiny_folders(Path(tmp)))


def run(args: argparse.Namespace, tiny: tuple[str, str]) -> None:
    cpu = args.cpu
    log("probe: does the dreamzero entry say it splits over ranks?")
    found = probe(tiny)
    log(f"probe: {found}")
    folders = tiny if cpu else ((args.checkpoint, args.tokenizer) if args.checkpoint and args.tokenizer else None)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    if not found["heads_split"]:
        skipped["2"] = ("the dreamzero entry's /v1/models description has no sequence_parallel: the model has "
                        "no path over several ranks yet, and realtime serve --sequence-parallel 2 would run it "
                        "on rank 0 alone")
    if folders is None:
        skipped["all"] = ("no DreamZero checkpoint on this machine: give --checkpoint and --tokenizer "
                          "(or DREAMZERO_CKPT and DREAMZERO_TOKENIZER)")
    else:
        for v in variants(found):
            try:
                rows.append(measure(args, folders, v))
            except Exception as exc:  # noqa: BLE001 - one variant's failure is its row; the others still run
                log(f"{v.name} failed: {type(exc).__name__}: {str(exc)[-300:]}")
                rows.append({"variant": v.name, "ranks": v.ranks, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"})
    by = {r["variant"]: r for r in rows if "policy_infer_ms_median" in r}
    over = ({name: round(r["policy_infer_ms_median"] / by["1"]["policy_infer_ms_median"], 3)
             for name, r in by.items() if name != "1"} if "1" in by else {})
    best = min(over.items(), key=lambda kv: kv[1]) if over else None
    results = {
        "question": "DreamZero's action chunk on 2 GPUs against 1, the faster of the heads (Ulysses) and CFG "
                    "splits (goal <= 0.6x)",
        "probe": found,
        "checkpoint": "tiny (tests), random weights" if cpu else (folders[0] if folders else None),
        "warmup_calls": args.warmup, "timed_calls": args.calls,
        "rows": rows,
        "skipped": skipped,
        "over_1": over,
        "best_two": best[0] if best else None,
        "two_over_one": best[1] if best else None,
        "goal": f"two_over_one <= {GOAL}",
        "within_goal": (best[1] <= GOAL) if best and not cpu else None,
    }
    if cpu:
        results["caveat"] = "CPU rehearsal with the tiny checkpoint on gloo ranks; the figures say nothing about GPUs"
    emit(step_report("dreamzero-2", "bench.parallel.dreamzero_sp", results, device=args.device, rehearsal=cpu),
         args.out, echo=False)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()

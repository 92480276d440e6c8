"""What every multi-GPU step records, and the one JSON the steps end up in.

Each step of bench/multi_gpu.sh writes its own ``multi_gpu_<step>.json`` (``step_report``:
its results beside the machine and its exact command), so that a step run alone, or one cut
short, keeps what it measured; ``merge`` puts every step file it is given into one JSON
(``python -m bench.parallel.record --out OUT/multi_gpu.json --note TEXT FILES...``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.machine import cpu_name, package_version
from bench.report import emit
from deploy.nginx import find_nginx

GIB = 1 << 30


def _query(command: Sequence[str]) -> str | None:
    """A tool's stdout, or None when it is missing or fails."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpus() -> list[dict[str, Any]]:
    """The GPUs ``nvidia-smi`` lists (index, name, memory, driver); [] on a machine without one."""
    text = _query(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                   "--format=csv,noheader,nounits"])
    out = []
    for line in (text or "").splitlines():
        index, name, memory_mib, driver = (part.strip() for part in line.split(","))
        out.append({"index": int(index), "name": name, "memory_gib": round(int(memory_mib) / 1024, 1),
                    "driver": driver})
    return out


def wait_gpus_idle(timeout_s: float = 60.0) -> float:
    """Wait until no process holds a GPU (a stopped server's ranks may take a moment to let go
    of their memory, and the next server plans its KV pool from what is free); the seconds
    waited. At once where there is no ``nvidia-smi``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        apps = _query(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
        if not apps:
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def machine() -> dict[str, Any]:
    """CPU, host memory, GPUs (with their interconnect matrix), Python and the packages the runs use."""
    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "host_memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {name: package_version(name) for name in
                     ("torch", "uvicorn", "starlette", "websockets", "diffusers", "transformers")},
        "gpus": gpus(),
        # NVLink or PCIe between each pair: what the sequence-parallel all-to-alls ride on.
        "gpu_topology": _query(["nvidia-smi", "topo", "-m"]),
        "nginx": nginx_version(),
    }


def nginx_version() -> str | None:
    """``nginx -v`` (it prints to stderr), or None where nginx is missing."""
    binary = find_nginx()
    if binary is None:
        return None
    return subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30).stderr.strip() or None


def command(module: str, argv: Sequence[str] | None = None) -> str:
    """The exact command that ran this step, as a shell would take it."""
    return shlex.join(["python3", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def source() -> dict[str, Any]:
    """The commit the code ran at, and the files changed since (a run of uncommitted code says so)."""
    repo = Path(__file__).resolve().parent.parent.parent
    changed = _query(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": _query(["git", "-C", str(repo), "rev-parse", "HEAD"]),
            "changed_files": None if changed is None else len(changed.splitlines())}


def step_report(step: str, module: str, results: dict[str, Any], *, device: str, rehearsal: bool) -> dict[str, Any]:
    """One step's JSON: its name, command, device, machine and source, then its results."""
    return {"step": step, "command": command(module), "device": device, "rehearsal": rehearsal,
            "machine": machine(), "source": source(), **results}


def merge(files: Sequence[str | Path], note: str, script: str | None) -> dict[str, Any]:
    """Every step file in one report: the machine once (the first step's), each step under its name."""
    steps: dict[str, Any] = {}
    for path in files:
        data = json.loads(Path(path).read_text())
        steps[data["step"]] = data
    first = next(iter(steps.values()), {})
    return {
        "benchmark": ("several GPUs of one host: replicas behind nginx against one replica (issue 51, run 1); "
                      "one LingBot-World session with sequence parallel over 1, 2, 4 GPUs (run 2); "
                      "DreamZero on 2 GPUs (run 3)"),
        "note": note,
        "script": script,
        "machine": first.get("machine"),
        "steps": steps,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="merge multi_gpu_<step>.json files into one report")
    parser.add_argument("files", nargs="*")
    parser.add_argument("--note", default="")
    parser.add_argument("--script", default=None, help="the script command that ran the steps")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    files = [f for f in args.files if Path(f).is_file()]
    emit(merge(files, args.note, args.script), args.out, echo=False)
    print(f"merged {len(files)} step(s) into {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

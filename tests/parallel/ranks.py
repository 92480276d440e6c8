"""Start a module as every rank of a gloo group on loopback, the way torchrun would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from realtime.server.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of ``size`` (one thread each: 2 shared cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REALTIME_")}
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def run_ranks(size: int, module: str, *args: str, timeout: float = 60.0) -> list[subprocess.CompletedProcess]:
    """``python -m module args`` as each of ``size`` ranks at once; every rank's completed process."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=rank_env(r, size, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(size)]
    done = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done

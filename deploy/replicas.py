"""N ``realtime serve`` replicas behind nginx on one machine, started and stopped as one.

    python -m deploy.replicas --replicas 3 --port 8000 [--gpus 0,1,2] [-- SERVE ARGS...]

nginx listens on ``--port``; replica i listens on ``--port + 1 + i`` (loopback by default).
With ``--gpus``, replica i runs with ``CUDA_VISIBLE_DEVICES`` set to the i-th entry, so each
process owns one GPU and its sessions' KV (``--replicas`` defaults to the number of GPUs).
Everything after ``--`` goes to every ``realtime serve`` (e.g. ``--models tiny --no-tts``).
Ctrl-C or SIGTERM stops nginx, then drains every replica (SIGTERM), then exits.

From code (the tests and bench/deploy do this)::

    with Deployment(replica_count=3, serve_args=["--models", "tiny", "--no-tts"]) as dep:
        url = f"ws://{dep.addr}/v1/realtime/world?session_id=w1"
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from deploy.nginx import Nginx, Upstream

log = logging.getLogger(__name__)

REPOSITORY = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0
# How long a drained replica may take to finish its ticks and close its sockets.
DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReplicaSpec:
    """Where replica ``index`` listens and which GPU it sees (None: CUDA_VISIBLE_DEVICES untouched)."""

    index: int
    host: str
    port: int
    gpu: str | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


def plan(replica_count: int | None, *, host: str, ports: Sequence[int],
         gpus: Sequence[str] | None = None) -> list[ReplicaSpec]:
    """One spec per replica: one port each, and one GPU each when ``gpus`` is given."""
    count = replica_count if replica_count is not None else len(gpus or ())
    if count < 1:
        raise ValueError("at least one replica is needed (give --replicas or --gpus)")
    if len(ports) < count:
        raise ValueError(f"{count} replicas need {count} ports, got {len(ports)}")
    if gpus is not None and len(gpus) != count:
        raise ValueError(f"{count} replicas need {count} GPUs (one process per GPU), got {list(gpus)}")
    return [ReplicaSpec(i, host, ports[i], gpus[i] if gpus is not None else None) for i in range(count)]


class Replica:
    """One ``realtime serve`` subprocess in its own process group, logging to a file."""

    def __init__(self, spec: ReplicaSpec, serve_args: Sequence[str], log_dir: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.extra_env = dict(env or {})
        self.serve_args = list(serve_args)
        self.log_path = log_dir / f"replica-{spec.index}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return self.spec.addr

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        # The replica imports this checkout, wherever it is started from.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPOSITORY), env.get("PYTHONPATH", "")) if p)
        if self.spec.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.spec.gpu
        return env

    def command(self) -> list[str]:
        return [sys.executable, "-m", "realtime", "serve", "--host", self.spec.host,
                "--port", str(self.spec.port), *self.serve_args]

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        log.info("replica %d: pid %d on %s (gpu %s), log %s", self.spec.index, self.proc.pid, self.addr,
                 self.spec.gpu, self.log_path)

    def healthy(self, timeout_s: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.addr}/healthz", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: the replica dies at once, as on a crash or a lost GPU."""
        self.signal(signal.SIGKILL)
        self.wait(10.0)

    def drain(self) -> None:
        """SIGTERM: stop listening, finish running ticks, close the sockets (see docs/deploy.md)."""
        self.signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None when it is still running after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Drain, and SIGKILL what is left after ``timeout_s``."""
        if not self.alive:
            return
        self.drain()
        if self.wait(timeout_s) is None:
            log.warning("replica %d did not exit within %.0f s of SIGTERM: killed", self.spec.index, timeout_s)
            self.kill()


class Deployment:
    """Replicas plus nginx: ``start`` brings all up (or none), ``stop`` always ends all."""

    def __init__(self, replica_count: int | None = None, *, host: str = "127.0.0.1", port: int | None = None,
                 replica_ports: Sequence[int] | None = None, gpus: Sequence[str] | None = None,
                 serve_args: Sequence[str] = (), log_dir: str | Path | None = None,
                 nginx_workers: str = "1", env: Mapping[str, str] | None = None, keep_logs: bool = False) -> None:
        count = replica_count if replica_count is not None else len(gpus or ())
        if port is None:  # tests and benchmarks: any free ports
            port, *free = free_ports(host, 1 + (count if replica_ports is None else 0))
            replica_ports = replica_ports if replica_ports is not None else free
        self.port = port
        if replica_ports is None:
            replica_ports = [port + 1 + i for i in range(count)]
        self.specs = plan(replica_count, host=host, ports=replica_ports, gpus=gpus)
        self.host = host
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="realtime-replicas-"))
        # A temp log folder of our own goes at stop, unless asked to keep it (the CLI prints it).
        self._remove_logs = log_dir is None and not keep_logs
        self.replicas = [Replica(spec, serve_args, self.log_dir, env) for spec in self.specs]
        self.nginx = Nginx([Upstream(s.host, s.port) for s in self.specs], host=host, port=self.port,
                           worker_processes=nginx_workers)

    @property
    def addr(self) -> str:
        """Where clients connect: nginx."""
        return self.nginx.addr

    def replica_at(self, addr: str) -> Replica:
        """The replica listening on ``host:port`` (what nginx's X-Upstream names)."""
        return next(r for r in self.replicas if r.addr == addr)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        # A port already taken would make another server's /healthz look like our replica's.
        taken = [p for p in [self.port, *(s.port for s in self.specs)] if not port_free(self.host, p)]
        if taken:
            raise RuntimeError(f"ports already in use on {self.host}: {taken}")
        try:
            for replica in self.replicas:
                replica.start()
            self.wait_healthy(timeout_s)
            self.nginx.start()
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(self.replicas)
        while waiting:
            for replica in list(waiting):
                if not replica.alive:
                    raise RuntimeError(f"replica {replica.spec.index} exited while starting:\n"
                                       f"{replica.log_text()[-3000:]}")
                if replica.healthy():
                    waiting.remove(replica)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"replicas {[r.spec.index for r in waiting]} not healthy "
                                   f"after {timeout_s:.0f} s")
            if waiting:
                time.sleep(0.1)

    def stop(self) -> None:
        """nginx first (no new connections), then every replica drains at once."""
        self.nginx.stop()
        for replica in self.replicas:
            replica.drain()
        for replica in self.replicas:
            replica.stop()
        if self._remove_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "Deployment":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct free ports (each held until all are picked, so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``port`` (SO_REUSEADDR, as uvicorn and nginx bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.replicas", description=__doc__.split("\n\n")[0],
                                     epilog="Arguments after -- are passed to every `realtime serve`.")
    parser.add_argument("--replicas", type=int, default=None, help="how many (default: one per --gpus entry)")
    parser.add_argument("--port", type=int, default=8000, help="nginx's port; replica i gets port+1+i")
    parser.add_argument("--host", default="127.0.0.1", help="where nginx and the replicas listen")
    parser.add_argument("--gpus", default=None,
                        help="comma-separated CUDA devices, one per replica (CUDA_VISIBLE_DEVICES per process)")
    parser.add_argument("--nginx-workers", default="auto", help="nginx worker_processes")
    parser.add_argument("--log-dir", default=None, help="where replica-<i>.log go (default: a temp folder)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.serve_args[:1] == ["--"]:
        args.serve_args = args.serve_args[1:]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    try:
        deployment = Deployment(args.replicas, host=args.host, port=args.port, gpus=gpus,
                                serve_args=args.serve_args, log_dir=args.log_dir, nginx_workers=args.nginx_workers,
                                keep_logs=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        deployment.start()
        print(f"serving on http://{deployment.addr} via nginx; replicas "
              f"{', '.join(r.addr for r in deployment.replicas)}; logs in {deployment.log_dir}", flush=True)
        reported: set[int] = set()
        while not stopping:
            for replica in deployment.replicas:
                if not replica.alive and replica.spec.index not in reported:
                    reported.add(replica.spec.index)
                    # nginx routes its sessions' reconnects and new sessions to the others.
                    log.error("replica %d (%s) exited with %s; see %s", replica.spec.index, replica.addr,
                              replica.proc.returncode if replica.proc else None, replica.log_path)
            time.sleep(0.5)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        deployment.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

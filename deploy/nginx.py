"""nginx in front of the replicas: render ``deploy/nginx/realtime.conf.template`` and run it.

nginx runs as an unprivileged process with a private run folder (config, pid, logs, temp
paths), listening on the address it is given only. Started by root (CI, a container), it
drops to ``nobody`` before it execs, so the master process never holds root either.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

TEMPLATE = Path(__file__).resolve().parent / "nginx" / "realtime.conf.template"
# Long enough for a session that idles between ticks; the replicas' 20 s pings keep it warm.
READ_TIMEOUT_S = 3600
CONNECT_TIMEOUT_S = 2
# A replica that refused a connection is left out this long before nginx tries it again.
FAIL_TIMEOUT_S = 10
UNPRIVILEGED_USER = "nobody"


class NginxError(RuntimeError):
    """nginx is missing, its config does not load, or it did not start."""


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


def render(upstreams: Sequence[Upstream], *, listen: str, run_dir: str, worker_processes: str = "1",
           worker_connections: int = 4096, read_timeout_s: int = READ_TIMEOUT_S,
           connect_timeout_s: int = CONNECT_TIMEOUT_S, fail_timeout_s: int = FAIL_TIMEOUT_S) -> str:
    """The nginx config for these replicas, listening on ``listen`` (``host:port``)."""
    if not upstreams:
        raise ValueError("at least one replica is needed")
    servers = "\n".join(f"        server {u.addr} max_fails=1 fail_timeout={fail_timeout_s}s;" for u in upstreams)
    values = {
        "servers": servers, "listen": listen, "run_dir": run_dir, "worker_processes": worker_processes,
        "worker_connections": str(worker_connections), "read_timeout_s": str(read_timeout_s),
        "connect_timeout_s": str(connect_timeout_s),
    }
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace("{{%s}}" % key, value)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise ValueError(f"unfilled placeholders in {TEMPLATE.name}: {left}")
    return text


def find_nginx() -> str | None:
    """The nginx binary (Debian puts it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)


def _drop_to() -> pwd.struct_passwd | None:
    """Whom to run nginx as: ``nobody`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return None


class Nginx:
    """One nginx master (plus its worker) in a private run folder; ``stop`` always ends it."""

    def __init__(self, upstreams: Sequence[Upstream], *, host: str, port: int,
                 worker_processes: str = "1", binary: str | None = None) -> None:
        self.upstreams = list(upstreams)
        self.host, self.port = host, port
        self.worker_processes = worker_processes
        self.binary = binary or find_nginx()
        self.run_dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def _command(self, *extra: str) -> list[str]:
        assert self.binary is not None and self.run_dir is not None
        # -e: the compiled-in error log (/var/log/nginx) is opened before the config is read.
        return [self.binary, "-p", str(self.run_dir), "-c", str(self.run_dir / "nginx.conf"),
                "-e", str(self.run_dir / "error.log"), *extra]

    def start(self, timeout_s: float = 10.0) -> None:
        if self.binary is None:
            raise NginxError("nginx not found: install Debian's nginx package (make nginx, as root)")
        self.run_dir = Path(tempfile.mkdtemp(prefix="realtime-nginx-"))
        user = _drop_to()
        conf = render(self.upstreams, listen=self.addr, run_dir=str(self.run_dir),
                      worker_processes=self.worker_processes)
        (self.run_dir / "nginx.conf").write_text(conf)
        kwargs: dict = {}
        if user is not None:
            for path in (self.run_dir, self.run_dir / "nginx.conf"):
                os.chown(path, user.pw_uid, user.pw_gid)
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        check = subprocess.run(self._command("-t", "-q"), capture_output=True, text=True, **kwargs)
        if check.returncode != 0:
            raise NginxError(f"nginx rejected its config:\n{check.stderr.strip()}")
        self.proc = subprocess.Popen(self._command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, **kwargs)
        deadline = time.monotonic() + timeout_s
        while not _accepts(self.host, self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                self.stop()
                raise NginxError(f"nginx did not start on {self.addr}: {err or self.error_log()[-2000:]}")
            time.sleep(0.02)
        log.info("nginx on %s (pid %d, run dir %s) in front of %s", self.addr, self.proc.pid, self.run_dir,
                 ", ".join(u.addr for u in self.upstreams))

    def error_log(self) -> str:
        return self._log("error.log")

    def access_log(self) -> str:
        """The access log so far: paths without their query strings (the template says why)."""
        return self._log("access.log")

    def _log(self, name: str) -> str:
        path = self.run_dir / name if self.run_dir else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (nginx's fast shutdown: open connections are closed), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal the process group ``proc`` leads (nginx's master and its workers)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False

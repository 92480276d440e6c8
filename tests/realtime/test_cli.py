"""``realtime serve`` as a user runs it: a real subprocess on a real port."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websockets

from models.factory import FactoryError
from realtime.server.cli import build_parser, parse_args
from realtime.server.server import free_port
from tests.support.process import wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--models", "tiny", "--policy", "dummy", "--no-tts"]


def realtime(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "realtime", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def test_a_busy_port_fails_at_once_with_one_line():
    """Issue 12, defect 5: the second server loaded every model before Errno 98."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        proc = realtime("serve", "--port", str(port))  # the default models: maze, policy, voice
        out, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert out == (f"realtime serve: cannot listen on 127.0.0.1:{port}: Address already in use "
                   "(another server running? choose another --port)\n")
    # One line and nothing else: no model started loading. 0.3 s on an idle dev machine (the
    # models alone took 23 s before the fix); the bound leaves room for a loaded CI machine.
    assert elapsed < 10.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_drains_and_exits_quietly_with_status_0(sig):
    """Issue 12, defect 4: Ctrl-C ended in ~20 lines of CancelledError / KeyboardInterrupt."""
    port = free_port()
    proc = realtime("serve", "--port", str(port), *QUICK)
    try:
        wait_until_ready(proc, port)

        async def session_open_during_the_signal() -> int | None:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime/world") as ws:
                await ws.send(json.dumps({"type": "session.create", "session_id": "s", "credits": 1}))
                assert json.loads(await ws.recv())["type"] == "session.created"
                proc.send_signal(sig)
                try:
                    while True:
                        await ws.recv()
                except websockets.ConnectionClosed as closed:
                    return closed.rcvd.code if closed.rcvd else None

        close_code = asyncio.run(asyncio.wait_for(session_open_during_the_signal(), 60))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Error" not in out and " ERROR " not in out, out
    assert "serving on http://127.0.0.1:" in out
    assert out.rstrip().endswith(f"Finished server process [{proc.pid}]"), out
    assert close_code == 1001  # drained: going away, after the running tick (realtime/server/server.py)


def test_serve_help_shows_every_option_with_help_and_defaults(capsys):
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = serve.choices["serve"]._actions
    assert [a.dest for a in options if not a.help] == []
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    listed = " ".join(text.split("options:", 1)[1].split())
    for option, default in [("--host HOST", "127.0.0.1"), ("--port PORT", "8000"),
                            ("--frames-per-chunk FRAMES_PER_CHUNK", "the model's own"), ("--log-level", "info"),
                            ("--allowed-origins ORIGINS", "loopback"), ("--models MODELS", "maze,maze-sim,tiny")]:
        after = listed.split(option, 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in after, (option, after)
    assert "(default: None)" not in text and "(default: False)" not in text


def test_trajectory_root_and_the_models_own_chunk_size_reach_the_world_config(tmp_path):
    from realtime.server.cli import config_from_args

    config = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu", "--trajectory-root", str(tmp_path)]))
    assert config.world.trajectory_root == str(tmp_path) and config.world.frames_per_chunk is None
    assert config_from_args(parse_args(["serve", *QUICK, "--device", "cpu"])).world.trajectory_root is None


def test_ticks_in_flight_reaches_the_world_config(capsys):
    from realtime.server.cli import config_from_args

    world = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu"])).world  # auto
    assert (world.session_ticks_in_flight, world.session_ticks_in_flight_alone) == (2, 1)
    config = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu", "--ticks-in-flight", "2"]))
    assert (config.world.session_ticks_in_flight, config.world.session_ticks_in_flight_alone) == (2, None)
    config = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu", "--ticks-in-flight", "1"]))
    assert (config.world.session_ticks_in_flight, config.world.session_ticks_in_flight_alone) == (1, None)
    with pytest.raises(SystemExit):
        parse_args(["serve", *QUICK, "--ticks-in-flight", "3"])
    assert "invalid choice" in capsys.readouterr().err


def test_cpu_format_reaches_the_engine_config_and_the_factories():
    from realtime.server.cli import config_from_args
    from realtime.server.inventory import _build_inventory

    assert config_from_args(parse_args(["serve", *QUICK, "--device", "cpu"])).engine.cpu_format is None  # auto
    config = config_from_args(parse_args(["serve", "--models", "maze", "--policy", "dummy", "--no-tts",
                                          "--device", "cpu", "--cpu-format", "float32"]))
    assert config.engine.cpu_format == "float32"
    maze = _build_inventory(config).adapters["maze"]
    assert (str(maze.dtype), maze.details()["dtype_pick"]) == ("torch.float32", None)


def test_client_limits_reach_the_config_with_documented_defaults(capsys):
    from realtime.server.cli import config_from_args
    from realtime.server.config import LimitsConfig, ServerConfig

    default = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu"]))
    assert default.limits == LimitsConfig(idle_timeout_s=300.0, max_sessions_per_client=32)
    assert default.forwarded_allow_ips == ServerConfig().forwarded_allow_ips == ("127.0.0.1", "::1")
    config = config_from_args(parse_args(["serve", *QUICK, "--device", "cpu", "--idle-timeout-s", "0",
                                          "--max-sessions-per-client", "4", "--forwarded-allow-ips",
                                          "10.0.0.5, 10.1.0.0/16"]))
    assert config.limits == LimitsConfig(idle_timeout_s=0.0, max_sessions_per_client=4)
    assert config.forwarded_allow_ips == ("10.0.0.5", "10.1.0.0/16")
    for bad in (["--idle-timeout-s", "-1"], ["--max-sessions-per-client", "-2"]):
        with pytest.raises(SystemExit):
            parse_args(["serve", *QUICK, *bad])
        assert "must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    listed = " ".join(capsys.readouterr().out.split())
    for option, default in [("--idle-timeout-s SECONDS", "300.0"), ("--max-sessions-per-client N", "32"),
                            ("--forwarded-allow-ips ADDRESSES", "127.0.0.1,::1")]:
        assert f"(default: {default})" in listed.split(option, 2)[2].split(" --", 1)[0], option


@pytest.mark.parametrize("bad, error", [
    (["--port", "99999"], "must be a TCP port in [0, 65535], got 99999"),  # the socket took it as 34463
    (["--port", "-1"], "must be a TCP port"),
    (["--max-batch", "-1"], "--max-batch: must be >= 1, got -1"),
    (["--max-batch", "0"], "--max-batch: must be >= 1"),
    (["--frames-per-chunk", "0"], "--frames-per-chunk: must be >= 1"),
    (["--steps", "0"], "--steps: must be >= 1"),
    (["--device", "cudaa"], "--device: must be cpu, cuda, cuda:N or auto, got 'cudaa'"),  # was torch's traceback
    (["--admin-from", "10.0.0.0/8,admins"], "--admin-from: not an address: 'admins'"),
    (["--drain-timeout", "inf"], "--drain-timeout: must be a finite number of seconds"),
    (["--trajectory-root", "/no/such/folder"], "--trajectory-root: no such directory"),
])
def test_out_of_range_numbers_are_refused_naming_the_option(bad, error, capsys):
    with pytest.raises(SystemExit):
        parse_args(["serve", *QUICK, *bad])
    assert error in capsys.readouterr().err


def test_a_model_named_twice_and_a_missing_cuda_device_are_refused_before_loading():
    from realtime.server.cli import config_from_args

    with pytest.raises(FactoryError, match="--models names maze more than once"):
        config_from_args(parse_args(["serve", "--models", "maze,tiny,maze", "--device", "cpu"]))
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(FactoryError, match="--device cuda: torch .* sees no CUDA device here"):
            config_from_args(parse_args(["serve", *QUICK, "--device", "cuda"]))


def test_admin_networks_match_their_addresses():
    from realtime.server.admin import admin_allowed

    allowed = parse_args(["serve", "--admin-from", "10.0.0.0/8, 192.168.1.7"]).admin_from
    assert allowed == ("10.0.0.0/8", "192.168.1.7")
    assert admin_allowed("10.3.4.5", allowed) and admin_allowed("192.168.1.7", allowed)
    assert not admin_allowed("11.0.0.1", allowed) and not admin_allowed("127.0.0.1", allowed)
    assert not admin_allowed("not-an-ip", allowed)


def test_openmp_defaults_set_a_passive_wait_unless_the_caller_chose():
    from realtime.server.cli import OPENMP_DEFAULTS, openmp_defaults

    env: dict[str, str] = {"PATH": "/bin"}
    openmp_defaults(env)
    assert env == {"PATH": "/bin", **OPENMP_DEFAULTS} == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE",
                                                         "OMP_NUM_THREADS": "1"}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}, {"OMP_NUM_THREADS": "2"}):
        env = dict(chosen)
        openmp_defaults(env)
        assert env == chosen


def test_lingbot_shortcuts_ride_on_the_models_entry_and_are_documented(capsys):
    from realtime.server.cli import config_from_args

    entry = "lingbot=/ckpt?steps=2&reuse_kv=1&fp8=ffn&decoder=taehv:/w/taew2_1.pth"
    config = config_from_args(parse_args(["serve", "--models", entry, "--policy", "dummy", "--no-tts",
                                          "--device", "cpu"]))
    assert config.world.models == (entry,)
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    listed = " ".join(capsys.readouterr().out.split())
    for text in ("'lingbot=DIR?key=value&...'", "steps=1..4", "reuse_kv=1", "fp8=ffn|attn|cross|all",
                 "decoder=wan|taehv:PATH", "a bad one stops the server at start"):
        assert text in listed, text


@pytest.fixture(scope="module")
def lingbot_checkpoint(tmp_path_factory):
    from models.world.lingbot.tiny_checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("lingbot") / "ckpt")


@pytest.mark.parametrize("query, error", [
    ("turbo=1", "unknown option 'turbo' (lingbot takes steps, reuse_kv, fp8, decoder, size)"),
    ("steps=5", "option steps=5: must be an integer in 1..4"),
    ("steps=0&reuse_kv=1", "option steps=0: must be an integer in 1..4"),
    ("fp8=mlp", "option fp8=mlp: must be 'all', 'none' or groups of ffn, attn, cross joined by '+'"),
    ("decoder=taehv:{bad}", "option decoder: {bad}: unknown tensor 'encoder.0.weight.extra': not in the "
                            "taew2_1 layout"),
], ids=["unknown-shortcut", "steps-out-of-range", "steps-zero", "fp8-group", "decoder-layout"])
def test_a_bad_lingbot_shortcut_stops_the_server_at_start_with_one_line_naming_it(
        query, error, lingbot_checkpoint, tmp_path, capsys):
    import torch

    from realtime.server.cli import main

    bad = tmp_path / "taew2_1.pth"
    if "{bad}" in query:
        taehv = pytest.importorskip("models.world.taehv")
        sd = taehv.random_state_dict(seed=0)
        sd["encoder.0.weight.extra"] = torch.zeros(1)
        torch.save(sd, bad)
    query, error = query.format(bad=bad), error.format(bad=bad)
    entry = f"lingbot={lingbot_checkpoint}?{query}"
    assert main(["serve", "--port", "0", "--device", "cpu", "--models", entry, "--policy", "dummy",
                 "--no-tts", "--log-level", "warning"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"realtime serve: {entry}: {error}"]

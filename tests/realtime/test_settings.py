"""``realtime serve``'s settings from flags, REALTIME_* variables and a --config file;
--print-config, --version and ``GET /version``."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from models.factory import FactoryError
from realtime.server import version as version_module
from realtime.server.cli import FLAG_ONLY, build_parser, config_from_args, main, parse_args, resolve_args, serve_parser
from realtime.server.option_types import KeyFile
from realtime.server.settings import env_name, option_name, options

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--models", "tiny", "--policy", "dummy", "--no-tts", "--device", "cpu"]


@pytest.fixture(autouse=True)
def no_realtime_variables(monkeypatch):
    """main() reads os.environ: none of the caller's REALTIME_* leak into these tests."""
    for name in list(os.environ):
        if name.startswith("REALTIME_"):
            monkeypatch.delenv(name)


@pytest.fixture
def samples(tmp_path) -> dict[str, str]:
    """A valid text, not the default, for every option of realtime serve."""
    keys = tmp_path / "keys.txt"
    keys.write_text("# the staging keys\n\nkf-1\nkf-2\n")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    return {
        "host": "0.0.0.0", "port": "8123", "models": "tiny,maze", "device": "cpu", "max-batch": "3",
        "ticks-in-flight": "1", "frames-per-chunk": "2", "steps": "2", "cpu-format": "bfloat16",
        "gpu-memory-fraction": "0.5", "kv-budget-gib": "1.5", "kv-host-gib": "0",
        "trajectory-root": str(tmp_path), "sequence-parallel": "2", "policy": "", "no-tts": "yes",
        "allowed-origins": "https://a.example, https://b.example", "admin-from": "10.0.0.0/8,192.168.1.7",
        "idle-timeout-s": "0", "max-sessions-per-client": "4", "forwarded-allow-ips": "10.0.0.5, 10.1.0.0/16",
        "drain-timeout": "2.5", "api-key": "k1,k2", "api-key-file": str(keys), "metrics-require-key": "1",
        "log-level": "debug", "no-access-log": "true", "config": str(empty),
    }


def serve_options() -> list[argparse.Action]:
    return options(serve_parser(build_parser()))


def as_flags(action: argparse.Action, text: str) -> list[str]:
    """``text`` as the command line would give it."""
    flag = f"--{option_name(action)}"
    if action.nargs == 0:
        return [flag]
    if isinstance(action, argparse._AppendAction):
        return [word for item in text.split(",") for word in (flag, item)]
    return [flag, text]


def test_every_option_comes_from_its_variable_as_its_flag_would_give_it(samples):
    settable = [a for a in serve_options() if a.dest not in FLAG_ONLY]
    assert sorted(option_name(a) for a in settable) == sorted(samples)  # a new option needs a sample
    assert env_name(next(a for a in settable if a.dest == "max_sessions_per_client")) == \
        "REALTIME_MAX_SESSIONS_PER_CLIENT"
    for action in settable:
        text = samples[option_name(action)]
        resolved = resolve_args(["serve"], {env_name(action): text})
        setting = next(s for s in resolved.settings if s.dest == action.dest)
        flagged = getattr(parse_args(["serve", *as_flags(action, text)]), action.dest)
        assert (setting.source, setting.origin, setting.value) == ("env", env_name(action), flagged), action.dest
        assert getattr(resolved.args, action.dest) == flagged
        assert setting.value != action.default, action.dest  # the sample shows a change


def test_every_option_comes_from_the_config_file_with_dashes_or_underscores(samples, tmp_path):
    settable = [a for a in serve_options() if a.dest not in (*FLAG_ONLY, "config")]
    for spelling in (str, lambda name: name.replace("-", "_")):
        path = tmp_path / "serve.toml"
        path.write_text("".join(f"{spelling(option_name(a))} = {json.dumps(samples[option_name(a)])}\n"
                                for a in settable))
        resolved = resolve_args(["serve", "--config", str(path)], {})
        for action in settable:
            setting = next(s for s in resolved.settings if s.dest == action.dest)
            flagged = getattr(parse_args(["serve", *as_flags(action, samples[option_name(action)])]), action.dest)
            assert (setting.source, setting.origin, setting.value) == ("file", str(path), flagged), action.dest


def test_the_files_own_types_are_taken_as_text(tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text('port = 8080\nno-tts = true\nmetrics-require-key = false\ngpu-memory-fraction = 0.5\n'
                    'allowed-origins = ["https://a.example", "https://b.example"]\napi-key = ["k1", "k2"]\n')
    args = resolve_args(["serve", "--config", str(path)], {}).args
    assert (args.port, args.no_tts, args.metrics_require_key, args.gpu_memory_fraction) == (8080, True, False, 0.5)
    assert args.allowed_origins == ("https://a.example", "https://b.example")
    assert args.api_key == ["k1", "k2"]


def test_json_and_yaml_files_are_read_as_toml_is(tmp_path):
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"port": 8081, "log_level": "warning", "api-key": "k1"}))
    args = resolve_args(["serve", "--config", str(path)], {}).args
    assert (args.port, args.log_level, args.api_key) == (8081, "warning", ["k1"])
    pytest.importorskip("yaml")
    path = tmp_path / "serve.yaml"
    path.write_text("port: 8082\nno-tts: yes\nforwarded-allow-ips: [10.0.0.5, 10.0.0.6]\n")
    args = resolve_args(["serve", "--config", str(path)], {}).args
    assert (args.port, args.no_tts, args.forwarded_allow_ips) == (8082, True, ("10.0.0.5", "10.0.0.6"))


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text('port = 1111\nmax-batch = 3\nlog-level = "debug"\ndrain-timeout = 5\n')
    env = {"REALTIME_PORT": "2222", "REALTIME_MAX_BATCH": "4", "REALTIME_CONFIG": str(path)}
    resolved = resolve_args(["serve", "--port", "3333"], env)
    args = resolved.args
    assert (args.port, args.max_batch, args.log_level, args.drain_timeout, args.host) == (
        3333, 4, "debug", 5.0, "127.0.0.1")
    assert {s.name: s.shown_source() for s in resolved.settings if s.source != "default"} == {
        "port": "flag", "max-batch": "env REALTIME_MAX_BATCH", "log-level": f"file {path}",
        "drain-timeout": f"file {path}", "config": "env REALTIME_CONFIG"}
    # A flag that repeats its default still wins; a falsy variable turns a file's flag off.
    path.write_text("no-tts = true\nport = 1111\n")
    args = resolve_args(["serve", "--config", str(path), "--port", "8000"], {"REALTIME_NO_TTS": "0"}).args
    assert (args.port, args.no_tts) == (8000, False)


def bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("env, file, error", [
    ({"REALTIME_PORT": "abc"}, None, "REALTIME_PORT: invalid port value: 'abc'"),
    ({"REALTIME_PORT": "99999"}, None, "REALTIME_PORT: must be a TCP port in [0, 65535], got 99999"),
    ({"REALTIME_MAX_BATCH": "0"}, None, "REALTIME_MAX_BATCH: must be >= 1, got 0"),
    ({"REALTIME_LOG_LEVEL": "loud"}, None,
     "REALTIME_LOG_LEVEL: invalid choice: 'loud' (choose from 'debug', 'info', 'warning', 'error')"),
    ({"REALTIME_NO_TTS": "maybe"}, None, "REALTIME_NO_TTS: want 1/0, true/false or yes/no, got 'maybe'"),
    ({"REALTIME_MAX_SESSION_PER_CLIENT": "3"}, None,
     "REALTIME_MAX_SESSION_PER_CLIENT: not an option (did you mean REALTIME_MAX_SESSIONS_PER_CLIENT?)"),
    ({"REALTIME_API_KEYS": "k"}, None, "REALTIME_API_KEYS: not an option (did you mean REALTIME_API_KEY?)"),
    ({"REALTIME_PRINT_CONFIG": "1"}, None, "REALTIME_PRINT_CONFIG: --print-config is a command-line flag only"),
    ({}, ("serve.toml", 'port = "abc"\n'), "{path}: port: invalid port value: 'abc'"),
    ({}, ("serve.toml", "max_batch = 0\n"), "{path}: max_batch: must be >= 1, got 0"),
    ({}, ("serve.toml", "prot = 1\n"), "{path}: prot: not an option (did you mean port?)"),
    ({}, ("serve.toml", 'config = "other.toml"\n'), "{path}: config: not an option of a config file"),
    ({}, ("serve.toml", "max-batch = 2\nmax_batch = 3\n"), "{path}: max_batch: given twice (as max-batch too)"),
    ({}, ("serve.toml", "port = \n"), "{path}: Invalid value (at line 1, column 8)"),
    ({}, ("serve.toml", "[port]\nvalue = 1\n"), "{path}: port: not a value (leave it out for the default)"),
    ({}, ("serve.json", '{"frames-per-chunk": null}'),
     "{path}: frames-per-chunk: not a value (leave it out for the default)"),
    ({}, ("serve.json", "[1, 2]"), "{path}: want a table of option names, got a list"),
    ({}, ("serve.ini", "port=1\n"), "{path}: unknown config format '.ini': want .toml, .json, .yaml or .yml"),
    ({}, ("keys.txt", "\n# nothing\n"), "REALTIME_API_KEY_FILE: '{path}' holds no key"),
])
def test_a_bad_value_is_one_line_naming_where_it_came_from(env, file, error, tmp_path, monkeypatch, capsys):
    path = bad(tmp_path, *file) if file else ""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["serve", *QUICK, "--print-config"]  # --no-tts overrides REALTIME_NO_TTS: checked all the same
    if path.endswith("keys.txt"):
        monkeypatch.setenv("REALTIME_API_KEY_FILE", path)
    elif path:
        argv += ["--config", path]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == ["realtime serve: " + error.format(path=path)]


def test_a_missing_config_file_and_a_yaml_one_without_pyyaml(tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "nope.toml")
    assert main(["serve", "--config", missing, "--print-config"]) == 2
    assert capsys.readouterr().err == f"realtime serve: {missing}: No such file or directory\n"
    path = bad(tmp_path, "serve.yml", "port: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    assert main(["serve", "--config", path, "--print-config"]) == 2
    assert capsys.readouterr().err == (f"realtime serve: {path}: a YAML config needs PyYAML, which is not "
                                       "installed: pip install pyyaml, or write the file as TOML or JSON\n")


def test_other_realtime_variables_of_the_project_are_not_options():
    assert resolve_args(["serve"], {"REALTIME_CACHE_DIR": "/tmp/x", "PATH": "/bin"}).args.port == 8000


def test_api_keys_from_flags_the_environment_and_a_file_add_up_once_each(tmp_path):
    keys = bad(tmp_path, "keys.txt", "# staging\n\n  k2  \nk#3\n")
    args = resolve_args(["serve", *QUICK, "--api-key-file", keys], {"REALTIME_API_KEY": "k1, k2,"}).args
    assert args.api_key == ["k1", "k2"] and args.api_key_file == KeyFile(keys, ("k2", "k#3"))
    assert config_from_args(args).api_keys == ("k1", "k2", "k#3")
    assert config_from_args(parse_args(["serve", *QUICK])).api_keys == ()
    args = parse_args(["serve", *QUICK, "--api-key", "a", "--api-key", "b", "--metrics-require-key"])
    config = config_from_args(args)
    assert (config.api_keys, config.metrics_require_key) == (("a", "b"), True)


def test_metrics_require_key_needs_a_key_and_a_key_must_fit_a_header():
    with pytest.raises(FactoryError, match=r"^--metrics-require-key: no API key is configured"):
        config_from_args(parse_args(["serve", *QUICK, "--metrics-require-key"]))
    with pytest.raises(FactoryError, match=r"^--api-key: API key 2 of 2") as refused:
        config_from_args(parse_args(["serve", *QUICK, "--api-key", "good", "--api-key", "two words"]))
    assert "two words" not in str(refused.value)


def test_print_config_shows_each_source_and_never_a_key(tmp_path, monkeypatch, capsys):
    keys = bad(tmp_path, "keys.txt", "kf-secret-1\nkf-secret-2\n")
    config = bad(tmp_path, "serve.toml", "max-batch = 7\n")
    monkeypatch.setenv("REALTIME_API_KEY_FILE", keys)
    monkeypatch.setenv("REALTIME_CONFIG", config)
    assert main(["serve", "--print-config", "--api-key", "flag-secret", "--host", "0.0.0.0"]) == 0
    out = capsys.readouterr().out
    assert "secret" not in out
    lines = {line.split(" = ", 1)[0]: " ".join(line.split(" = ", 1)[1].split()) for line in out.splitlines()}
    assert list(lines) == [option_name(a) for a in serve_options() if a.dest not in FLAG_ONLY]
    assert lines["host"] == '"0.0.0.0" # flag'
    assert lines["port"] == "8000 # default"
    assert lines["max-batch"] == f"7 # file {config}"
    assert lines["api-key"] == '["<redacted>"] # flag'
    assert lines["api-key-file"] == f'"{keys} (2 keys)" # env REALTIME_API_KEY_FILE'
    assert lines["config"] == f'"{config}" # env REALTIME_CONFIG'
    assert lines["allowed-origins"] == '["loopback"] # default'
    assert lines["frames-per-chunk"] == "null # default"


def realtime(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "realtime", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=60)


def test_print_config_binds_nothing_and_loads_nothing():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = ("import sys\nfrom realtime.server.cli import main\n"
                f"code = main(['serve', '--print-config', '--port', '{port}'])\n"
                "print('torch loaded:', 'torch' in sys.modules, 'exit:', code)")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stderr == ""
    assert done.stdout.splitlines()[1].split() == ["port", "=", str(port), "#", "flag"]
    assert done.stdout.splitlines()[-1] == "torch loaded: False exit: 0"


def test_version_is_the_installed_distributions():
    done = realtime("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"realtime {importlib.metadata.version('realtime-sessions')}\n", "")


def test_a_source_checkout_that_was_never_installed_says_so(monkeypatch, tmp_path):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert version_module.package_version() == "0.1.0+source"  # pyproject.toml's
    monkeypatch.setattr(version_module, "PYPROJECT", tmp_path / "pyproject.toml")
    assert version_module.package_version() == "unknown"


def test_get_version_names_the_server_python_and_torch_only_once_loaded(monkeypatch):
    from realtime.server.app import build_app
    from realtime.server.config import ServerConfig
    from realtime.server.inventory import Inventory
    from tests.e2e.conftest import serve

    import torch

    with serve(build_app(ServerConfig(), Inventory())) as addr:
        answer = httpx.get(f"http://{addr}/version")
    assert answer.status_code == 200
    assert answer.json() == {"version": importlib.metadata.version("realtime-sessions"),
                             "python": platform.python_version(), "torch": torch.__version__}
    monkeypatch.delitem(sys.modules, "torch")
    assert version_module.versions()["torch"] is None


def test_help_tells_the_settings_rule(capsys):
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("REALTIME_MAX_SESSIONS_PER_CLIENT", "A flag beats the environment, which beats the file, which "
                 "beats the default", "REALTIME_API_KEY takes keys separated by commas",
                 "a second Ctrl-C exits at once with status 130"):
        assert said in text, said

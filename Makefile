# The two set-up commands of the README: `make serve` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned: a bare `torch` requirement with no torch installed pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# PyPI's Linux torch is the CUDA build (several GB). On Linux without an NVIDIA GPU the CPU build
# comes from PyTorch's own index, when that index answers; offline or behind a local wheel mirror
# (where the pinned torch is what pip's own configuration finds) pip's configuration decides.
# `make serve TORCH_INDEX=` always uses pip's configuration; TORCH_INDEX=URL picks another index.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(shell [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 && \
  $(PY) -c 'import urllib.request as r; r.urlopen("$(TORCH_CPU_INDEX)/torch/", timeout=5)' \
  >/dev/null 2>&1 && echo $(TORCH_CPU_INDEX))
HOST ?= 127.0.0.1
PORT ?= 8000
# More `realtime serve` options, e.g. SERVE_ARGS="--models tiny --no-tts".
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: serve test install install-dev chromium nginx

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

TORCH_PIP = "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

install: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIP)
	$(BIN)/pip install -q -e '.[tts,robot]'

install-dev: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIP)
	$(BIN)/pip install -q -e '.[tts,dev,video]'

# Debian's Chromium for the browser tests (playwright cannot download browsers here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: browser tests will be skipped"; fi; }

# Debian's nginx for the replica tests (tests/deploy run their own unprivileged nginx on
# loopback, so the package's service is not wanted: RUNLEVEL=1 keeps invoke-rc.d from starting it).
nginx:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
	  else echo "nginx not found: the deploy tests will be skipped"; fi; }

serve: install
	$(BIN)/realtime serve --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test: install-dev chromium nginx
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The lower bounds of pyproject's bounded dependencies, installed apart and run against the
# transport and endpoint tests (part of `make test`; this runs it alone).
.PHONY: test-lower-bounds
test-lower-bounds: install-dev
	$(BIN)/python -m pytest -q tests/test_dependency_bounds.py $(PYTEST_ARGS)

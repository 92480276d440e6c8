# The two set-up commands of the README: `make serve` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned: a bare `torch` requirement with no torch installed pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: serve test install install-dev chromium nginx

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[tts]'

install-dev: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[tts,dev]'

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
	$(BIN)/realtime serve --host 127.0.0.1 --port 8000

test: install-dev chromium nginx
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

#!/usr/bin/env bash
# OpenPI robot fleets on the H200 host's CPU pinned to 2 cores (a 2-core machine, quiet): ours vs
# the restated reference openpi-server at 1 / 4 / 16 robots, interleaved in one run, ~3 minutes,
# JSON to $OUT. Run from the checkout's root (the device tool's copy) with the wheels carried in
# ../.whl. Optional, beside it: .base/ (another checkout, e.g. `git archive <commit>`: served as
# "baseline", a before/after in the same run) and .whl-extra/*.whl (a uvloop wheel: then
# "ours-uvloop" too, ours as `pip install` gives it; ours itself stays on asyncio's loop, as the
# reference always is).
set -u
extra=$(ls .whl-extra/*.whl 2>/dev/null)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    ../.whl/*.whl $extra || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
servers="ours reference"
base=()
if [ -d .base ]; then servers="$servers baseline"; base=(--baseline .base --baseline-label "${BASE_LABEL:-.base}"); fi
if python3 -c "import uvloop" 2>/dev/null; then servers="$servers ours-uvloop"; fi
lscpu | grep -m1 "Model name" | tee "$OUT/cpu.txt"
CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 timeout 235 taskset -c 0,1 python3 -m bench.openpi.bench_fleet \
    --clients 1 4 16 --rounds 4 --seconds 1.5 --servers $servers "${base[@]}" --no-uvloop \
    --out "$OUT/openpi_fleet_pinned.json" 2>&1 | grep -v "^INFO" | tail -n 30
echo "rc=${PIPESTATUS[0]}"

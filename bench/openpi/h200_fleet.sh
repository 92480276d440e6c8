#!/usr/bin/env bash
# OpenPI robot fleets on the H200 host's CPU pinned to 2 cores (a 2-core machine, quiet): ours vs
# the restated reference openpi-server at 1 / 4 / 16 robots, interleaved in one run, ~3 minutes,
# JSON to $OUT. Run from the checkout's root (the device tool's copy) with the wheels carried in
# ../.whl. Optional, beside it: .base/ (another checkout, e.g. `git archive <commit>`: served as
# "baseline", a before/after in the same run) and .whl-extra/*.whl (a uvloop wheel: then
# "ours-uvloop" too, ours as `pip install` gives it; ours itself stays on asyncio's loop, as the
# reference always is). LAYERS=1: then bench/openpi/ablate_layers.py too (~2 more minutes,
# same cores): per-call server CPU layer by layer (reference, bare uvicorn, Starlette, our
# endpoint with unpackb, + decode, + the policy's run_batch, + the engine's inline submit, ours), JSON
# to $OUT/openpi_layers_pinned.json.
#
# The device command (main vs this checkout vs the reference, with the layers), from the
# lead's /work/main after `rsync` of the branch to .dev_<branch>/ and
# `mkdir -p .dev_<branch>/.base && git archive main | tar -x -C .dev_<branch>/.base`:
#   cd .dev_<branch> && BASE_LABEL=main LAYERS=1 bash bench/openpi/h200_fleet.sh
# with carry [".dev_<branch>", ".whl"].
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
if [ "${LAYERS:-0}" = 1 ]; then
  CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 timeout 300 taskset -c 0,1 python3 -m bench.openpi.ablate_layers \
      --clients 4 16 --rounds 3 --seconds 1.5 --out "$OUT/openpi_layers_pinned.json" 2>&1 | grep -v "^INFO" | tail -n 6
  echo "layers rc=${PIPESTATUS[0]}"
fi

#!/usr/bin/env bash
# LingBot-World at full geometry on the H200 (issue 16, "GPU figures"): one process, about 6 minutes,
# JSON to $OUT/lingbot_h200.json. Random 14B weights built on the GPU in bf16 (seconds), then
# (bench/world/bench_lingbot.py says what each is): bare tick vs served world.v1 on loopback, key press
# to first frame (whole chunks, and stream_frames), KV bytes vs the capacity formula, two resident
# sessions, three on a pool for two (swap vs pinned bandwidth), memory, attention at 4,680 x 37,440.
# Carried: .whl (starlette, uvicorn, websockets, diffusers wheels). Run from the repo root (or the .dev_ copy).
# CPU smoke test: DEVICE=cpu ARGS="--tiny --warmup-ticks 2 --ticks 2" OUT=/tmp/o bench/h200_lingbot.sh
set -u
if ! python3 -c "import uvicorn, websockets, starlette, diffusers" 2>/dev/null; then
    WHL=$(ls -d .whl ../.whl 2>/dev/null | head -1)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# shellcheck disable=SC2086
timeout "${LIMIT_S:-500}" python3 -m bench.world.bench_lingbot --device "${DEVICE:-cuda}" \
    --budget-s "${BUDGET_S:-330}" ${ARGS:-} --out "$OUT/lingbot_h200.json" 2>&1 | tail -n 150
echo "== bench_lingbot rc=${PIPESTATUS[0]}"

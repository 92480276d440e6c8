#!/usr/bin/env bash
# Serving at the model's limit on the H200 (issue 19), one process, about 2 minutes, JSON to $OUT:
# maze on CUDA through the real server vs the bare adapter in the same run, each row with the
# per-batch profile (bench/world/serve_profile.py: model / engine post / hand-off+loop / wake):
#   rgb8 @ 1,4,..,256 sessions   the scaling curve (frames/s per session and total, tick p99,
#                                the bare model's prediction and the kv capacity formula beside it)
#   jpeg @ 32, jpeg/inline @ 32  jpeg encoded on the thread pool vs on the loop (goal: jpeg >= 0.95x rgb8)
#   rgb8/gil5 @ 1,32,128         Python's 5 ms GIL switch interval (before) vs the engine's 0.5 ms
# Carried: .whl (starlette, uvicorn, websockets wheels). Run from the repo root (or the .dev_ copy).
set -u
if ! python3 -c "import uvicorn, websockets, starlette" 2>/dev/null; then
    WHL=$(ls -d .whl ../.whl 2>/dev/null | head -1)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# CPU smoke test: MODEL=instant DEVICE=cpu VARIANTS="rgb8@1,4 jpeg@4" OUT=/tmp/o bench/h200_serving.sh
VARIANTS=${VARIANTS:-rgb8@1,4,16,32,64,128,256 jpeg@32 jpeg/inline@32 rgb8/gil5@1,32,128}
# shellcheck disable=SC2086
timeout 200 python3 -m bench.world.bench_served --model "${MODEL:-maze}" --device "${DEVICE:-cuda}" \
    --seconds 2 --warmup 1 --max-batch 128 --batch-wait-ms 20 --client-procs 6 --variants $VARIANTS \
    --out "$OUT/world_serving_h200.json" 2>&1 | grep -v '^  ' | tail -n 40
echo "== world_serving rc=${PIPESTATUS[0]}"

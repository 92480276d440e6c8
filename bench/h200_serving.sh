#!/usr/bin/env bash
# Serving at the model's limit on the H200 (issue 19): one command, about 4 minutes (every step
# bounded: 9 minutes at most; the gil rows and step add ~1 minute), JSON to $OUT.
#   1. jpeg per frame at 480x832 (LingBot) and 64x64 (maze): PIL on one thread and on the encoder
#      pool vs nvJPEG batched on CUDA (bench/world/bench_jpeg.py)
#   2. maze on CUDA through the real server vs the bare adapter, one server, one run
#      (bench/world/bench_served.py), each row with the engine's busy share, tick p50/p99, GPU
#      memory and the per-batch profile (model / post / hand-off+loop / wake):
#        rgb8/auto @ 1,..,256   the scaling curve of the default server (--ticks-in-flight auto);
#                               1/32/128 are the served-vs-bare goal rows
#        rgb8 @ 1,32,128        the same rows with one tick in flight (--ticks-in-flight 1)
#        jpeg/auto @ 32         CUDA frames' jpeg path picked by measurement on the first batch
#        jpeg/auto/pil, .../nvjpeg  the same row with each path forced (goal: jpeg >= 0.95x rgb8)
#   2b. the maze batch alone vs beside a thread running 3 ms of the loop's send Python, and the
#      torch calls before the frame's launch (bench/world/bench_gil_handoff.py)
#   3. cProfile of the engine thread at 32 sessions (one profiler per process from Python 3.12) (bench/world/profile_engine.py)
#   4. the summary: every goal beside its figure, the capacity formula beside the curve
#      (bench/world/serving_summary.py -> $OUT/serving_summary.json, and the tail of the log)
# Run from the repo root (or a .dev_ copy) with .whl carried (starlette, uvicorn, websockets...).
# CPU dry run of the whole script (tiny settings, instant model): DRY=1 OUT=/tmp/o bench/h200_serving.sh
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
if ! $PY -c "import uvicorn, websockets, starlette" 2>/dev/null; then
    WHL=$(ls -d .whl ../.whl 2>/dev/null | head -1)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${DRY:-0}" = 1 ]; then
    MODEL=${MODEL:-instant} DEVICE=${DEVICE:-cpu} SECONDS_PER_ROW=${SECONDS_PER_ROW:-0.6} WARMUP=${WARMUP:-0.3}
    VARIANTS=${VARIANTS:-rgb8/auto@1,2,4 jpeg/auto@2 jpeg/auto/pil@2 jpeg/auto/nvjpeg@2} PROCS=${PROCS:-2} JPEG_SIZES=${JPEG_SIZES:-96x160}
    JPEG_BATCH=${JPEG_BATCH:-4} BARE_REPEATS=${BARE_REPEATS:-3} PROFILE_SESSIONS=${PROFILE_SESSIONS:-2}
    GIL_MODEL=${GIL_MODEL:-maze-host} GIL_SESSIONS=${GIL_SESSIONS:-1 4} GIL_REPEATS=${GIL_REPEATS:-3}
fi
MODEL=${MODEL:-maze} DEVICE=${DEVICE:-cuda}
VARIANTS=${VARIANTS:-rgb8/auto@1,2,4,8,16,32,64,128,256 rgb8@1,32,128 jpeg/auto@32 jpeg/auto/pil@32 jpeg/auto/nvjpeg@32}
# 12 client processes: one tops out near 1,000 chunks/s, and the load must not be the bottleneck.
PROCS=${PROCS:-12} SECONDS_PER_ROW=${SECONDS_PER_ROW:-4} WARMUP=${WARMUP:-1.5} BARE_REPEATS=${BARE_REPEATS:-20}
JPEG_SIZES=${JPEG_SIZES:-480x832 64x64} JPEG_BATCH=${JPEG_BATCH:-32} PROFILE_SESSIONS=${PROFILE_SESSIONS:-32}
# Each step's whole log goes to $LOGS (the device tool brings back 8 files from $OUT: the JSONs).
LOGS=${LOGS:-/tmp/h200_serving_logs}; mkdir -p "$LOGS"
status=0
step() {  # step NAME SECONDS CMD...: bounded, its tail in the log, its rc remembered
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    # The JSON is in $OUT; the log shows each step's last lines, cut short (the summary has the figures).
    grep -v '^  ' "$LOGS/$name.log" | grep -v '^[{}]' | tail -n "${TAIL:-12}" | cut -c1-"${WIDTH:-200}"
    echo "== $name rc=$rc"
    [ "$rc" = 0 ] || status=1
}
$PY - "$OUT/h200_serving_env.json" "$0 $*" <<'EOF'
import json, os, platform, subprocess, sys
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return repr(exc)
env = {"command": sys.argv[2], "python": platform.python_version(), "cpu_count": os.cpu_count(),
       "cpu": platform.processor() or platform.machine(),
       # a .dev_ copy has no .git: the caller names the commit it was copied from
       "source_commit": os.environ.get("SOURCE_COMMIT") or run("git", "log", "-1", "--format=%H %s"),
       "nvidia_smi": run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"),
       "settings": {k: os.environ.get(k) for k in ("MODEL", "DEVICE", "VARIANTS", "PROCS", "SECONDS_PER_ROW", "DRY")}}
for mod in ("torch", "torchvision", "uvicorn", "websockets", "starlette", "numpy", "PIL"):
    try:
        env[mod] = __import__(mod).__version__
    except Exception as exc:  # noqa: BLE001
        env[mod] = None
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env))
EOF
export MODEL DEVICE VARIANTS PROCS SECONDS_PER_ROW DRY
# shellcheck disable=SC2086
step jpeg_paths 60 $PY -m bench.world.bench_jpeg --sizes $JPEG_SIZES --batch "$JPEG_BATCH" \
    --out "$OUT/jpeg_paths_h200.json"
# shellcheck disable=SC2086
step world_serving 300 $PY -m bench.world.bench_served --model "$MODEL" --device "$DEVICE" \
    --seconds "$SECONDS_PER_ROW" --warmup "$WARMUP" --bare-repeats "$BARE_REPEATS" --max-batch 128 \
    --batch-wait-ms 20 --client-procs "$PROCS" --variants $VARIANTS --out "$OUT/world_serving_h200.json"
# What the loop's Python costs a batch being set up, without a server (GIL hand-offs).
# shellcheck disable=SC2086
step gil_handoff 75 $PY -m bench.world.bench_gil_handoff --model "${GIL_MODEL:-$MODEL}" --device "$DEVICE" \
    --sessions ${GIL_SESSIONS:-1 32 128} --repeats "${GIL_REPEATS:-12}" --loop-ms 3 --out "$OUT/gil_handoff_h200.json"
# Which functions fill the hand-off: cProfile of the engine thread and the loop at 32 sessions.
step engine_profile 75 $PY -m bench.world.profile_engine --model "$MODEL" --device "$DEVICE" --thread engine \
    --sessions "$PROFILE_SESSIONS" --seconds "$SECONDS_PER_ROW" --client-procs "$PROCS" \
    --out "$OUT/engine_profile_h200.json"
TAIL=60 WIDTH=400 step summary 30 $PY -m bench.world.serving_summary "$OUT/world_serving_h200.json" "$OUT/jpeg_paths_h200.json" \
    --profile "$OUT/engine_profile_h200.json" --variant rgb8/auto --out "$OUT/serving_summary.json"

ls -la "$OUT"
exit $status

#!/usr/bin/env bash
# Every GPU measurement of issue 48 (DreamZero-DROID served as a stateful robot policy), run from the
# repository root on one CUDA machine (H100 or H200); JSON results to $OUT. Each step fits one
# 10-minute command; with no step named, bare then served run (about 12 minutes).
#
#   OUT=/tmp/out bash bench/gpu_dreamzero.sh [bare|served|text-full]...
#
# Steps (each bounded; the 14B DiT with random weights at DROID's full size, bf16, 352 x 640 frames):
#   bare       the FLOP count and the bf16 matmul rate (roofline per chunk), one robot's chunks without a
#              server for the exact 16 steps and the step cache (first call, steady calls, DiT time
#              against the roofline), memory per session against the capacity formula, a swap round trip,
#              the sessions resident at 0.9 of memory and with swap (~4 min) -> dreamzero_bare.json
#   served     one robot through a real server and the real openpi-client with the step cache (served/bare
#              beside a bare run of the same schedule), then 4 robots at once (as many as are resident on
#              an 80 GB card): alone, batched bare and served; chunks/s against the roofline, p50/p99 per
#              robot, each robot's chunks against its chunks alone (~6 min) -> dreamzero_served.json
#   text-full  bare with umt5-xxl's full encoder (24 layers) instead of the stand-in: the memory it
#              takes from the sessions (~4 min) -> dreamzero_text_full.json
# Server packages missing on the GPU machine come from wheels in .whl/ when that folder exists.
set -u
cd "$(dirname "$0")/.." || exit 1
STEPS=("$@")
[ $# -gt 0 ] || STEPS=(bare served)
TAIL=${TAIL:-40}
. bench/gpu_env.sh
# The robots are the real openpi-client: from .whl/ when the machine lacks it (gpu_env.sh checks the server's).
if [ -d .whl ] && ! python3 -c "import openpi_client" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_openpi \
        .whl/openpi_client-*.whl .whl/dm_tree-*.whl || exit 1
    export PYTHONPATH=/tmp/site_openpi:$PYTHONPATH
fi
BENCH=(python3 -m bench.policy.bench_dreamzero --device cuda --budget-s 420)
for step in "${STEPS[@]}"; do
    case $step in
    bare)
        run 580 "${BENCH[@]}" --only arithmetic bare memory --out "$OUT/dreamzero_bare.json" ;;
    served)
        run 580 "${BENCH[@]}" --only bare served robots --schedules step_cache --out "$OUT/dreamzero_served.json" ;;
    text-full)
        run 580 "${BENCH[@]}" --text-encoder full --only arithmetic bare memory --schedules step_cache \
            --out "$OUT/dreamzero_text_full.json" ;;
    *)
        echo "unknown step: $step" >&2; status=2 ;;
    esac
done
ls -la "$OUT"
exit $status

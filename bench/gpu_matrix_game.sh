#!/usr/bin/env bash
# Every GPU measurement of issue 49 (many Matrix-Game 2.0 players on one GPU), run from the repository
# root on one CUDA machine (H100 or H200); JSON results to $OUT. Each step fits one 10-minute command;
# with no step named, both run in order (about 18 minutes).
#
#   OUT=/tmp/out bash bench/gpu_matrix_game.sh [wan|taehv]...
#
# Steps (each bounded; the base variant's DiT with random weights at full size, 352 x 640, bf16):
#   wan     decoded by the Wan VAE (its real config): bare N sessions batched vs one at a time for
#           N = 1,2,4,8,16,32, served players N = 1..16 over world.v1 (served/bare), key press to first
#           frame, KV bytes and capacity at 0.9 of memory (~8 min) -> matrix_game_wan.json
#   taehv   the same with the small TAEHV decoder (random weights in the taew2_1 layout) (~8 min)
#           -> matrix_game_taehv.json
# Server packages missing on the GPU machine come from wheels in .whl/ when that folder exists.
set -u
cd "$(dirname "$0")/.." || exit 1
STEPS=("$@")
[ $# -gt 0 ] || STEPS=(wan taehv)
TAIL=${TAIL:-40}
. bench/gpu_env.sh
BENCH=(python3 -m bench.world.bench_matrix_game --device cuda --budget-s 420)
for step in "${STEPS[@]}"; do
    case $step in
    wan)
        run 540 "${BENCH[@]}" --decoder wan --out "$OUT/matrix_game_wan.json" ;;
    taehv)
        run 540 "${BENCH[@]}" --decoder taehv --out "$OUT/matrix_game_taehv.json" ;;
    *)
        echo "unknown step: $step" >&2; status=2 ;;
    esac
done
ls -la "$OUT"
exit $status

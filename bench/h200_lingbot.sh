#!/usr/bin/env bash
# Every GPU measurement of issue 45 (LingBot-World at the GPU's limit), run from the repository root
# on one CUDA machine; JSON results to $OUT. Each step fits one 10-minute command; with no step
# named, all run in order (about 40 minutes on an H200).
#
#   OUT=/tmp/out bash bench/h200_lingbot.sh STEP...    # e.g. bash bench/h200_lingbot.sh ab fp8-drift
#
# Steps (each bounded; 14B transformer with random weights at full size, 480 x 832, bf16):
#   exact          the exact path: bare tick by phase, served vs bare, key press to first frame, two
#                  sessions, swap, KV bytes, capacity, attention (~6 min) -> lingbot_h200.json
#   ab             each shortcut against the exact path in one run, 8 chunks each: reuse_kv, steps 3/2/1,
#                  fp8 ffn/attn/cross/all, the TAEHV decoder, all combined; chunk time, passes, latent
#                  error, frame PSNR; the FP8 kernel against its emulation (~6 min) -> lingbot_ab_h200.json
#   fp8-drift      FP8 sets over 32 chunks against the exact path: ffn, all (~7 min) -> lingbot_fp8_drift_h200.json
#   fp8-drift-2    the same for attn, cross (~7 min) -> lingbot_fp8_drift_2_h200.json
#   shortcuts      the served path with every shortcut on (steps=1, reuse_kv, fp8=ffn, TAEHV): bare tick,
#                  served vs bare, key press to first frame (stream_frames too), KV bytes, capacity (~4 min)
#                  -> lingbot_shortcuts_h200.json
#   fp8-capacity   the sessions one GPU holds with all linears in FP8 (the capacity plan beside one bare
#                  tick; without FP8 it is in lingbot_h200.json) (~2 min) -> lingbot_fp8_capacity_h200.json
#   taehv          the TAEHV decoder alone, 12-frame chunks (~2 min) -> taehv_decode_h200.json
# Server packages missing on the GPU machine come from wheels in .whl/ when that folder exists.
# Copy the results into bench/results/ and run `python -m bench.docs` to update docs/benchmarks.md.
set -u
cd "$(dirname "$0")/.." || exit 1
STEPS=("$@")
[ $# -gt 0 ] || STEPS=(exact ab fp8-drift fp8-drift-2 shortcuts fp8-capacity taehv)
TAIL=${TAIL:-40}
. bench/gpu_env.sh
BENCH=(python3 -m bench.world.bench_lingbot --device cuda)
ALL='steps=1&reuse_kv=1&fp8=ffn&decoder=taehv:random'
for step in "${STEPS[@]}"; do
    case $step in
    exact)
        run 560 "${BENCH[@]}" --budget-s 330 --out "$OUT/lingbot_h200.json" ;;
    ab)
        run 580 "${BENCH[@]}" --ab --out "$OUT/lingbot_ab_h200.json" ;;
    fp8-drift)
        run 580 "${BENCH[@]}" --ab 'fp8=ffn' 'fp8=all' --ab-chunks 32 --out "$OUT/lingbot_fp8_drift_h200.json" ;;
    fp8-drift-2)
        run 580 "${BENCH[@]}" --ab 'fp8=attn' 'fp8=cross' --ab-chunks 32 --out "$OUT/lingbot_fp8_drift_2_h200.json" ;;
    shortcuts)
        run 500 "${BENCH[@]}" --options "$ALL" --only bare served ttff sessions kv --budget-s 300 \
            --out "$OUT/lingbot_shortcuts_h200.json" ;;
    fp8-capacity)
        run 300 "${BENCH[@]}" --options 'fp8=all' --only bare --warmup-ticks 1 --ticks 2 \
            --out "$OUT/lingbot_fp8_capacity_h200.json" ;;
    taehv)
        run 300 python3 -m bench.world.bench_taehv --device cuda --out "$OUT/taehv_decode_h200.json" ;;
    *)
        echo "unknown step: $step" >&2; status=2 ;;
    esac
done
ls -la "$OUT"
exit $status

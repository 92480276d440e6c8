#!/usr/bin/env bash
# The GPU benchmarks, run from the repository root on a CUDA machine; JSON results to $OUT.
#
#   OUT=/tmp/out bash bench/gpu.sh STEP...      # e.g. bash bench/gpu.sh world   or   bash bench/gpu.sh kv vae openpi
#
# Steps (each bounded; the times are the H200's):
#   world        maze world serving, 1..256 sessions, served vs bare (~5 min) -> world_serving_curve_h200.json
#   kv           paged attention, swap, bookkeeping; the Triton kernel's check (~5 min)
#                -> kv_gpu.json, kv_bookkeeping_h200.json, kv_triton_check.json
#   vae          Wan VAE streaming decode (~2 min) -> wan_vae_decode_h200.json
#   openpi       the flow and maze policies in the engine, batched vs one at a time (~1 min)
#                -> openpi_gpu_h200.json, openpi_gpu_h200_maze_policy.json
#   tts          32 speech sessions (~1 min; needs the voice converted to fp16 in .gpu/voice16) -> tts_h200.json
#   pi0          pi0 full size, random weights, bare vs served (~4 min) -> pi0_h200.json
#   lingbot      LingBot-World 14B, random weights (~6 min) -> lingbot_h200.json
#   soak-start   the 10-minute soak (32 worlds, 8 robots) in the background; it outlasts one 10-minute
#   soak-finish  command, so `soak-finish` on the same machine waits for it -> soak_h200.json
# Server packages missing on the GPU machine come from wheels in .whl/ when that folder exists.
# Copy the results into bench/results/ and run `python -m bench.docs` to update docs/benchmarks.md.
set -u
[ $# -gt 0 ] || { sed -n '2,19p' "$0"; exit 2; }
cd "$(dirname "$0")/.." || exit 1
. bench/gpu_env.sh
for step in "$@"; do
    case $step in
    world)
        # The default server (two ticks in flight for a session in a loop), then one tick in
        # flight, then jpeg frames with each encoder path.
        # shellcheck disable=SC2086
        run 330 python3 -m bench.world.bench_served --model maze --device cuda --seconds 4 --warmup 1.5 \
            --bare-repeats 20 --max-batch 128 --batch-wait-ms 20 --client-procs 12 \
            --variants ${VARIANTS:-rgb8/auto@1,2,4,8,16,32,64,128,256 rgb8@1,32,128 jpeg/auto@32 jpeg/auto/pil@32 jpeg/auto/nvjpeg@32} \
            --out "$OUT/world_serving_curve_h200.json" ;;
    kv)
        run 200 python3 bench/kv/bench_kv.py --out "$OUT/kv_gpu.json"
        run 40 python3 bench/kv/bench_kv.py --only bookkeeping --out "$OUT/kv_bookkeeping_h200.json"
        run 60 python3 bench/kv/check_triton_paged.py --out "$OUT/kv_triton_check.json" ;;
    vae)
        run 150 python3 -m bench.world.bench_wan_vae --budget-s 100 --out "$OUT/wan_vae_decode_h200.json" ;;
    openpi)
        run 100 python3 -m bench.openpi.bench_gpu_policy --device cuda --out "$OUT/openpi_gpu_h200.json"
        run 100 python3 -m bench.openpi.bench_gpu_policy --policy maze --device cuda --robots 1 8 32 --seconds 1.5 \
            --out "$OUT/openpi_gpu_h200_maze_policy.json" ;;
    tts)
        python3 bench/upcast_voice.py .gpu/voice16 /tmp/voice || { status=1; continue; }
        run 100 python3 -m bench.tts.bench_tts --sessions 32 --device cuda --voice-dir /tmp/voice \
            --phonemes bench/tts/phonemes.json --out "$OUT/tts_h200.json" ;;
    pi0)
        run 300 python3 -m bench.pi0.bench_pi0 --device cuda --seconds 4 --out "$OUT/pi0_h200.json" ;;
    lingbot)
        TAIL=60 run 500 python3 -m bench.world.bench_lingbot --device cuda --budget-s 330 --out "$OUT/lingbot_h200.json" ;;
    soak-start)
        setsid nohup python3 -m bench.soak.run_soak --device cuda --seconds 600 --worlds 32 --robots 8 --voices 0 \
            --out /tmp/soak_h200.json > /tmp/soak.log 2>&1 < /dev/null &
        echo "soak started (pid $!); run soak-finish on this machine after it" ;;
    soak-finish)
        while pgrep -f "bench.soak.run_soak" > /dev/null; do sleep 2; done
        cp /tmp/soak_h200.json /tmp/soak.log "$OUT/" || status=1
        tail -n 30 /tmp/soak.log ;;
    *)
        echo "unknown step: $step" >&2; status=2 ;;
    esac
done
ls -la "$OUT"
exit $status

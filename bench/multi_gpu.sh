#!/usr/bin/env bash
# Every measurement of issue 51 that needs several GPUs of one host, run from the repository root;
# JSON to $OUT: one file a step (multi_gpu_<step>.json), merged into $OUT/multi_gpu.json after
# the steps ran (hardware, versions and each step's exact command inside). Each step is bounded
# and fits one 10-minute command; with no step named, all run in order.
#
#   OUT=/tmp/out bash bench/multi_gpu.sh STEP...     # e.g. bash bench/multi_gpu.sh replicas
#   PATH=.venv/bin:$PATH CPU=1 OUT=/tmp/out bash bench/multi_gpu.sh   # the CPU rehearsal (~4 min on 2 cores)
#
# Steps:
#   replicas      2 replicas of `realtime serve --models maze` behind nginx, one per GPU (0, 1),
#                 64 sessions: aggregate frames/s against 1 replica on GPU 0 in the same run (goal
#                 >= 1.9x), every session's chunks contiguous, then the busier replica killed: its
#                 sessions' close, the others streaming on, new sessions on the live one (~3 min)
#                 -> multi_gpu_replicas.json (bench/deploy/gpu_replicas.py)
#   lingbot-ckpt  a LingBot-World checkpoint at full size with random weights in $LINGBOT_RANDOM
#                 (default /tmp/lingbot-random-14b, ~28 GiB; kept for later runs) (~3 min)
#   lingbot-sp    one LingBot-World session, 480x832, served with --sequence-parallel 1, 2, 4 (each
#                 its own server): 12-frame chunk time and key press to first frame, 2 and 4 over 1
#                 (goals 0.55x, 0.3x) (~6 min; writes the checkpoint first when missing)
#                 -> multi_gpu_lingbot_sp.json (bench/parallel/lingbot_sp.py)
#   dreamzero-2   DreamZero on 2 GPUs against 1 when its entry says it splits (its /v1/models), else
#                 skipped with the reason; needs DREAMZERO_CKPT and DREAMZERO_TOKENIZER for figures
#                 -> multi_gpu_dreamzero_2.json (bench/parallel/dreamzero_sp.py)
# With CPU=1 every driver runs with --cpu: CPU replicas (the maze, 8 sessions, one torch thread
# each), the tiny LingBot checkpoint at 32x32 on gloo ranks, the tiny DreamZero checkpoint; the
# ratios on shared cores mean nothing. The rehearsal's JSON is multi_gpu_cpu_rehearsal.json in
# bench/results/. Server packages missing on a GPU machine come from wheels in .whl/, and nginx,
# where the machine has none, from Debian's package in .nginx/ (fetched on a Debian machine with
# `mkdir -p .nginx && (cd .nginx && apt-get download nginx)`), unpacked under /tmp/nginx-root.
set -u
cd "$(dirname "$0")/.." || exit 1
STEPS=("$@")
[ $# -gt 0 ] || STEPS=(replicas lingbot-sp dreamzero-2)
TAIL=${TAIL:-30}
. bench/gpu_env.sh
PY=${PY:-python3}
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && ls .nginx/*.deb >/dev/null 2>&1; then
    for f in .nginx/*.deb; do dpkg -x "$f" /tmp/nginx-root; done
    export PATH=/tmp/nginx-root/usr/sbin:$PATH
fi
CPU=${CPU:-}
LINGBOT_RANDOM=${LINGBOT_RANDOM:-/tmp/lingbot-random-14b}
if [ -n "$CPU" ]; then
    MODE=(--cpu)
    REPLICAS=(--sessions "${SESSIONS:-8}")
    LINGBOT=(--checkpoint "${LINGBOT_TINY:-/tmp/lingbot-random-tiny}")
    NOTE=${NOTE:-"CPU rehearsal of bench/multi_gpu.sh: no GPU; CPU replicas, the tiny LingBot checkpoint on gloo ranks and the tiny DreamZero checkpoint, sharing this machine's cores. It checks that every step runs and records its fields; the ratios mean nothing and are not the goals."}
else
    MODE=()
    REPLICAS=(--gpus 0 1 --sessions "${SESSIONS:-64}")
    LINGBOT=(--checkpoint "$LINGBOT_RANDOM")
    NOTE=${NOTE:-"GPU run of bench/multi_gpu.sh (issue 51)."}
fi
for step in "${STEPS[@]}"; do
    case $step in
    replicas)
        run 560 "$PY" -m bench.deploy.gpu_replicas "${MODE[@]}" "${REPLICAS[@]}" --out "$OUT/multi_gpu_replicas.json" ;;
    lingbot-ckpt)
        [ -n "$CPU" ] && args=(--tiny "${LINGBOT[1]}") || args=("$LINGBOT_RANDOM")
        run 580 "$PY" -m bench.parallel.random_lingbot "${args[@]}" ;;
    lingbot-sp)
        if [ -z "$CPU" ] && ! grep -qs '"complete": true' "$LINGBOT_RANDOM/random.json"; then
            run 580 "$PY" -m bench.parallel.random_lingbot "$LINGBOT_RANDOM"
        fi
        run 590 "$PY" -m bench.parallel.lingbot_sp "${MODE[@]}" "${LINGBOT[@]}" --out "$OUT/multi_gpu_lingbot_sp.json" ;;
    dreamzero-2)
        run 580 "$PY" -m bench.parallel.dreamzero_sp "${MODE[@]}" --out "$OUT/multi_gpu_dreamzero_2.json" ;;
    *)
        echo "unknown step: $step" >&2; status=2 ;;
    esac
done
"$PY" -m bench.parallel.record --note "$NOTE" --script "${CPU:+CPU=1 }bash bench/multi_gpu.sh${*:+ $*}" \
    --out "$OUT/multi_gpu.json" "$OUT"/multi_gpu_replicas.json "$OUT"/multi_gpu_lingbot_sp.json \
    "$OUT"/multi_gpu_dreamzero_2.json || status=1
ls -la "$OUT"
exit $status

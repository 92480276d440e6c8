#!/usr/bin/env bash
# The 10-minute GPU soak of issue 14 (32 maze worlds + 8 robots on one H200), which outlasts one
# 10-minute device command, so it runs in two back-to-back calls on the same warm machine:
#   bash bench/h200_soak.sh start    # starts the soak in its own process session (setsid), then runs
#                                    # the CUDA-only tests beside it and returns before the limit
#   bash bench/h200_soak.sh finish   # waits for the soak, copies its JSON and log to $OUT
# Carried: .whl (starlette, uvicorn, websockets, openpi-client, h11 wheels).
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
case "${1:-}" in
start)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    began=$(date +%s)
    setsid nohup python3 -m bench.soak.run_soak --device cuda --seconds 600 --worlds 32 --robots 8 --voices 0 \
        --note 'H200 host (16 cores); the CUDA-only tests ran beside it for the first minutes' \
        --out /tmp/soak_h200.json >/tmp/soak.log 2>&1 </dev/null &
    timeout 400 python3 -m pytest -q -p no:cacheprovider tests/kv tests/models 2>&1 | tee "$OUT/cuda_tests.txt" | tail -n 25
    tail -n 3 /tmp/soak.log
    while (( $(date +%s) - began < ${SOAK_START_HOLD_S:-560} )); do sleep 5; done
    tail -n 2 /tmp/soak.log ;;
finish)
    while pgrep -f bench.soak.run_soak >/dev/null; do sleep 2; done
    cp /tmp/soak_h200.json /tmp/soak.log "$OUT/" 2>/dev/null
    tail -n 60 /tmp/soak.log ;;
*) echo "usage: $0 start|finish" >&2; exit 2 ;;
esac

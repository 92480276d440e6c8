#!/usr/bin/env bash
# The H200 measurements of this project in one command (device tool, repo root, results to $OUT).
# Carried: .whl (starlette, uvicorn, websockets, openpi-client wheels) and .gpu/voice16 (the converted
# joe voice in fp16, upcast back to fp32 here). Each step is bounded so the whole run fits 10 minutes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
step() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" 2>&1 | tail -n 40; echo "== $name rc=$?"; }
step world 130 python3 -m bench.world.bench_served --model maze --device cuda --sessions 1 8 32 128 \
    --seconds 4 --warmup 2 --max-batch 128 --batch-wait-ms 20 --client-procs 4 --out "$OUT/world_served_h200.json"
step kv_triton 60 python3 bench/kv/check_triton_paged.py --out "$OUT/kv_triton_check.json"
step kv_tune 170 python3 bench/kv/bench_attention_tune.py --no-flex --budget-s 140 --out "$OUT/kv_attention_tune.json"
step kv_book 40 python3 bench/kv/bench_kv.py --only bookkeeping --out "$OUT/kv_bookkeeping_h200.json"
step wan_vae 150 python3 -m bench.world.bench_wan_vae --budget-s 100 --out "$OUT/wan_vae_decode_h200.json"
step openpi 100 python3 -m bench.openpi.bench_gpu_policy --device cuda --out "$OUT/openpi_gpu_h200.json"
python3 bench/upcast_voice.py .gpu/voice16 /tmp/voice
step tts 100 python3 -m bench.tts.bench_tts --sessions 32 --device cuda --voice-dir /tmp/voice \
    --phonemes bench/tts/phonemes.json --out "$OUT/tts_h200.json"
ls -la "$OUT"

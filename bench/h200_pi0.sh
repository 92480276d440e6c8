#!/usr/bin/env bash
# One H200 command (device tool, repo root, results to $OUT; carry .whl): pi0's bench alone first
# (bench/pi0/bench_pi0.py: bare, served and its split, the cuBLAS baseline), then the CUDA tests on
# four pinned cores beside the world bench's rgb8 / jpeg (encoder processes) / jpeg on threads rows
# at 32 sessions (ABCCBA, one run).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 240 python3 -m bench.pi0.bench_pi0 --device cuda --seconds 1.5 --out "$OUT/pi0_h200.json" 2>&1 | tail -n 25
(OMP_NUM_THREADS=4 taskset -c 12-15 timeout 330 python3 -m pytest tests/kv tests/models tests/realtime/test_media.py -q -x -p no:cacheprovider \
    > "$OUT/cuda_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/cuda_tests.txt") &
taskset -c 0-11 timeout 330 python3 -m bench.world.bench_served --model maze --device cuda --seconds 3 --warmup 1.5 \
    --bare-repeats 10 --max-batch 128 --batch-wait-ms 20 --client-procs 8 \
    --variants rgb8@32 jpeg@32 jpeg/threads@32 jpeg/threads@32 jpeg@32 rgb8@32 --out "$OUT/world_jpeg_h200.json" 2>&1 | tail -n 15
wait
tail -n 8 "$OUT/cuda_tests.txt"

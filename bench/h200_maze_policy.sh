#!/usr/bin/env bash
# Train the maze navigation policy (issue 18) and evaluate it, on the H200, in one command of < 9 minutes.
# Results to $OUT: maze_policy.safetensors (the new weights), maze_policy_train_log_$NAME.json,
# maze_policy_eval_h200_$NAME.json (new weights: policy vs planner vs random, 200 unseen mazes per goal kind),
# maze_policy_eval_h200_${NAME}_before.json (the shipped weights on the same mazes, same machine), gpu.txt.
# Needs torch, numpy, safetensors, msgpack (all in the GPU image); no server packages.
# Run from the repository root on the GPU machine: `bash bench/h200_maze_policy.sh` (no wheels needed).
# Knobs (environment): DEVICE (cuda), MINUTES (training wall clock, 7.7: the shipped run 8's), NAME (the
# run's name in the result files, "new"), MAZES (200), TRAIN_ARGS (extra train flags; the shipped run 8:
# "--workers 12"), SWEEP (validation mazes for an execute-horizon sweep before the evaluation, 0 = none),
# BEFORE (1: also evaluate the shipped weights).
# CPU dry run (about 3 minutes on 2 cores):
#   DEVICE=cpu MINUTES=0.4 MAZES=2 TRAIN_ARGS="--tiny --envs 8 --bs 16 --buffer 4000 --updates 1 --workers 2" \
#       OUT=/tmp/o bench/h200_maze_policy.sh
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NAME=${NAME:-new}
DEVICE=${DEVICE:-cuda}; MINUTES=${MINUTES:-7.7}; MAZES=${MAZES:-200}; SWEEP=${SWEEP:-0}; BEFORE=${BEFORE:-1}
RUN=${RUN:-/tmp/maze_policy_run}   # checkpoints stay off $OUT (optimiser state: not worth carrying back)
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
fi
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
# Training stops itself at MINUTES; the timeout only guards against a hang (start-up and the final save).
limit=$(python3 -c "print(int(${MINUTES} * 60 + 90))")
echo "== train (${MINUTES} min)"
# shellcheck disable=SC2086
timeout "$limit" python3 -m models.policy.maze.training.train --minutes "$MINUTES" --device "$DEVICE" --out "$RUN" \
    --log-every 15 ${TRAIN_ARGS:-} 2>&1 | tail -n 60
rc=${PIPESTATUS[0]}; echo "== train rc=$rc"
[ -f "$RUN/maze_policy.safetensors" ] || exit 1
cp "$RUN/maze_policy.safetensors" "$OUT/maze_policy.safetensors"
cp "$RUN/train_log.json" "$OUT/maze_policy_train_log_$NAME.json"
sweep=(); [ "$SWEEP" -gt 0 ] && sweep=(--sweep "$SWEEP")
echo "== evaluate new weights"
timeout 240 python3 -m models.policy.maze.training.evaluate --weights "$OUT/maze_policy.safetensors" --mazes "$MAZES" \
    --device "$DEVICE" ${sweep[@]+"${sweep[@]}"} --out "$OUT/maze_policy_eval_h200_$NAME.json" 2>&1 | grep -v '^ ' | tail -n 20
echo "== evaluate rc=${PIPESTATUS[0]}"
if [ "$BEFORE" = 1 ]; then
    echo "== evaluate the shipped weights (same mazes, same machine)"
    timeout 120 python3 -m models.policy.maze.training.evaluate --mazes "$MAZES" --device "$DEVICE" \
        --out "$OUT/maze_policy_eval_h200_${NAME}_before.json" 2>&1 | grep -v '^ ' | tail -n 10
    echo "== evaluate before rc=${PIPESTATUS[0]}"
fi
python3 - "$OUT" "$NAME" <<'EOF'
import json, sys
from pathlib import Path
out, run = Path(sys.argv[1]), sys.argv[2]
for name in (f"maze_policy_eval_h200_{run}.json", f"maze_policy_eval_h200_{run}_before.json"):
    p = out / name
    if p.is_file():
        r = json.loads(p.read_text())
        kinds = {k: (v["planner"]["success"], v["random"]["success"], v["policy"]["success"], v["policy_vs_planner"])
                 for k, v in r["per_kind"].items()}
        print(name, "policy/planner mean", r["policy_vs_planner_mean"], "(planner, random, policy, ratio):", kinds)
EOF
ls -la "$OUT"

#!/usr/bin/env bash
# Issue 19, the CPU goal, on the GPU host in one command (under 5 minutes): the old and the new CPU
# default of `realtime serve` through world.v1 at 1 and 4 sessions pinned to 2 cores, the CPU
# adapter's candidate variants A/B in one process, a profile of the new default, and the maze
# model card's quality gates of each candidate sampler, evaluated on the GPU meanwhile.
#
#   device run, carry [".dev_h-cpufps", ".whl"]:   cd .dev_h-cpufps && bash bench/maze/cpu_ab.sh
#
# NEW is this tree; OLD_ROOT (default: .., the checkout the device tool sent) holds the old
# default: run it before the branch is merged there, or point OLD_ROOT at a pre-merge copy.
# Pinned like bench/results/maze_serve_cpu_pinned.json: taskset -c 0,1, OMP_NUM_THREADS=2, CUDA
# hidden; the evaluations run on the GPU from cores 4-15. Results: $OUT/*.json, summary at the end.
set -u
NEW=$(pwd)
OLD=$(cd "${OLD_ROOT:-..}" && pwd)
WHL=${WHL:-$OLD/.whl}
OUT=${OUT:-/tmp/cpu_ab_out}
mkdir -p "$OUT"
[ "${SKIP_WHL:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
    || echo "wheel install failed (serving needs starlette, uvicorn, websockets)"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
lscpu > "$OUT/lscpu.txt" 2>&1
md5sum "$OLD/models/world/maze/adapter.py" "$NEW/models/world/maze/adapter.py" > "$OUT/trees.txt"
echo "old tree $OLD, new tree $NEW; $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' "$OUT/lscpu.txt" | sort -u | tr '\n' ' ')"

# -- quality: the card's evaluation command per candidate sampler (64 mazes, the CPU column's size),
#    on the GPU, two cores each, in the background
core=4
ev() {
    local name=$1; shift
    (cd "$NEW" && PYTHONPATH=/tmp/site:$NEW taskset -c "$core,$((core + 1))" timeout 270 \
        "$PY" -m models.world.maze.evaluate --mazes 64 "$@" --out "$OUT/maze_eval_cpu_$name.json" \
        > "$OUT/eval_$name.log" 2>&1; echo "eval $name rc=$?") &
    core=$((core + 2))
}
[ "${EVAL:-1}" = 1 ] || ev() { :; }
ev s2w4 --steps 2 --window 4
ev s2w4_kvlast --steps 2 --window 4 --kv-from-last --shift 0.1111
ev s2w3 --steps 2 --window 3
ev s2w2 --steps 2 --window 2
ev s2w2_kvlast --steps 2 --window 2 --kv-from-last --shift 0.1111
ev s3w2_kvlast --steps 3 --window 2 --kv-from-last --shift 0.1111

# -- speed: pinned, one phase at a time
# (SERVE_S, BARE_TICKS, AB_TICKS, PROFILE_TICKS shrink it for a smoke test)
step() { local name=$1 limit=$2 dir=$3; shift 3; echo "== $name"
         (cd "$dir" && timeout "$limit" env CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 PYTHONPATH="/tmp/site:$dir" \
              taskset -c 0,1 "$@" 2>&1 | grep -v '^ \|^{\|^}\|^\]' | tail -n 30); echo "== $name done"; }
serve=("$PY" -m bench.maze.bench_serve_cpu --seconds "${SERVE_S:-6}" --warmup 2 --bare-ticks "${BARE_TICKS:-20}"
       --no-bare-after)
step serve_old 110 "$OLD" "${serve[@]}" --out "$OUT/maze_serve_cpu_pinned_old.json"
step serve_new 110 "$NEW" "${serve[@]}" --out "$OUT/maze_serve_cpu_pinned_new.json"
step ab 150 "$NEW" "$PY" -m bench.maze.bench_cpu_ab --sessions 1 4 --ticks "${AB_TICKS:-12}" --variants "" \
    "dtype=bfloat16" "kv_from_last=1 shift=0.1111" "window=3" "window=2" "window=2 kv_from_last=1 shift=0.1111" \
    "steps=3 window=2 kv_from_last=1 shift=0.1111" "steps=1" --out "$OUT/maze_cpu_ab_pinned.json"
step profile 40 "$NEW" "$PY" -m bench.maze.profile_cpu --ticks "${PROFILE_TICKS:-4}" \
    --out "$OUT/maze_profile_cpu_pinned.json"
wait

# -- summary
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None
for tag in ("old", "new"):
    d = load(f"maze_serve_cpu_pinned_{tag}.json")
    if d:
        for variant, per in d["summary"].items():
            print(f"serve {tag:3s} {variant}: " + ", ".join(
                f"{n} sess {v['served_frames_per_s_per_session_min']:.2f} fps/session (bare {v['bare_frames_per_s_per_session'][0]:.2f})"
                for n, v in per.items()) + "   goals: 1 sess >= 15, 4 sess >= 5 each")
d = load("maze_cpu_ab_pinned.json")
if d:
    print("cpu", d["cpu_model"], d["cpu_capability"], "bf16 flags", d["cpu_bf16_flags"])
    for r in d["rows"]:
        print(f"ab {r['variant']:40s} {r['sessions']} sess: {r['frames_per_s_per_session']:6.2f} fps/session, "
              f"tick {r['tick_ms_p50']:6.1f} ms, x{r['vs_first_tick_p50']:.2f} of the default")
evals = {}
for p in sorted(out.glob("maze_eval_cpu_*.json")):
    d = json.loads(p.read_text())
    g = d["gates"]
    evals[p.stem[len("maze_eval_cpu_"):]] = d
    print(f"eval {p.stem[len('maze_eval_cpu_'):]:12s} one-step {d['one_step']['model_db']:.2f} / no-key min "
          f"{d['no_key']['min_over_frames_of_mean_db']:.2f} / wall {d['wall']['mean_db_vs_frozen_truth']:.2f} / "
          f"J-L {d['action_following']['turn_j_vs_l']['closer_to_own']:.3f} / W-S "
          f"{d['action_following']['move_w_vs_s']['closer_to_own']:.3f} / ID {d['inverse_dynamics']['ratio']:.2f}; "
          f"failed: {[k for k, v in g.items() if v is False] or 'none'}")
# The fastest candidate that meets every gate the current CPU configuration (s2w4) meets.
CANDIDATES = {  # evaluation name -> (bench_cpu_ab variant, SERVING_DEFAULTS row)
    "s2w4": ("", "ServingDefaults(steps=2, window=4)"),
    "s2w4_kvlast": ("kv_from_last=1 shift=0.1111", "ServingDefaults(steps=2, window=4, kv_from_last=True, shift=0.1111)"),
    "s2w3": ("window=3", "ServingDefaults(steps=2, window=3)"),
    "s2w2": ("window=2", "ServingDefaults(steps=2, window=2)"),
    "s2w2_kvlast": ("window=2 kv_from_last=1 shift=0.1111",
                    "ServingDefaults(steps=2, window=2, kv_from_last=True, shift=0.1111)"),
    "s3w2_kvlast": ("steps=3 window=2 kv_from_last=1 shift=0.1111",
                    "ServingDefaults(steps=3, window=2, kv_from_last=True, shift=0.1111)"),
}
ab = load("maze_cpu_ab_pinned.json")
if ab and "s2w4" in evals:
    need = {k for k, v in evals["s2w4"]["gates"].items() if v}
    speed = {(r["variant"], r["sessions"]): r["tick_ms_p50"] for r in ab["rows"]}
    ok = [(speed.get((CANDIDATES[n][0] or "default", 1), 1e9), n) for n, d in evals.items()
          if n in CANDIDATES and need <= {k for k, v in d["gates"].items() if v}]
    best = min(ok)[1] if ok else "s2w4"
    print(f"gates the current CPU configuration meets: {sorted(need)}")
    print(f"fastest candidate meeting all of them: {best} -> in models/world/maze/adapter.py set "
          f"SERVING_DEFAULTS['cpu'] = {CANDIDATES[best][1]}")
EOF
ls -la "$OUT"

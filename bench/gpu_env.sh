# Sourced by the GPU scripts (bench/gpu.sh, bench/h200_lingbot.sh) from the repository root:
# server packages the machine lacks come from wheels in .whl/ when that folder exists, $OUT
# exists, the card is recorded in $OUT/gpu.txt, and `run SECONDS CMD...` runs one bounded step.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import uvicorn, websockets, starlette" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null
status=0
run() {  # run SECONDS CMD...: bounded, the tail of its output shown ($TAIL lines), a failure remembered
    local limit=$1; shift
    echo "== $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tail -n "${TAIL:-25}"
    local rc=${PIPESTATUS[0]}
    echo "== rc=$rc"
    [ "$rc" = 0 ] || status=1
}

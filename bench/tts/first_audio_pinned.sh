#!/usr/bin/env bash
# bench/tts/first_audio on 2 pinned, quiet cores of the GPU host's CPU, results to $OUT, in ~1-2 minutes.
# Two runs: the server's OpenMP wait (realtime.cli: OMP_WAIT_POLICY=PASSIVE) and spin-waiting
# (GOMP_SPINCOUNT=300000). Run from the repo root. Needs only torch, transformers, safetensors and
# numpy there, plus .voice16: the converted joe voice in fp16 (made where the tts extra is installed:
#   python -c "import glob,shutil,os; from safetensors.torch import load_file,save_file; \
#     s=glob.glob(os.path.expanduser('~/.cache/realtime-sessions/tts/en_US-joe-medium-*'))[0]; os.makedirs('.voice16'); \
#     save_file({k:(v.half() if v.is_floating_point() else v) for k,v in load_file(s+'/model.safetensors').items()}, \
#     '.voice16/model.safetensors'); [shutil.copy(s+'/'+f,'.voice16') for f in ('meta.json','voice.json')]"
# ), upcast back to fp32 here: the weights are fp16-rounded, which changes no timing.
# CPUS and UTTERANCES override the cores (2,3) and the utterances per variant (24).
set -u
python3 bench/upcast_voice.py .voice16 /tmp/voice || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
for wait in passive spin; do
    case $wait in
        passive) policy=OMP_WAIT_POLICY=PASSIVE ;;
        spin) policy=GOMP_SPINCOUNT=300000 ;;
    esac
    timeout 80 taskset -c "${CPUS:-2,3}" env "$policy" python3 -m bench.tts.first_audio --voice-dir /tmp/voice \
        --phonemes bench/tts/phonemes.json --utterances "${UTTERANCES:-24}" --first-frames 8 --threads 2 \
        --out "$OUT/tts_first_audio_pinned_$wait.json" > "$OUT/first_audio_$wait.log" 2>&1
    echo "== $wait rc=$?"
    grep -E "^\[first_audio" "$OUT/first_audio_$wait.log"
done

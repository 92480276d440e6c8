"""The adapter's time to first audio piece by piece, before and after, in one run.

Every variant is a ``PiperTTS`` over the same converted weights; they take turns
utterance by utterance (in a rotating order) so load from other processes hits
them alike. For each utterance the variant's real path runs --
``run_batch([SynthesizeSentence])`` from the moment the sentence is complete --
with its methods wrapped to time the pieces of the first chunk::

    run_batch ─ phonemize ─ text encoder ─ durations ─ regulate+noise ─ flow prefix ─ first window ─ pcm/checks
                 (espeak)    (6 layers)     (SDP, 3 flows) (prior z_p)    (4 couplings)  (HiFi-GAN)

then the rest of the sentence window by window, for the real-time factor, the
worst stall a listener would hear (a chunk later than the audio before it ran
out), and the audio itself: each variant's PCM is compared with the one-shot
synthesis (``TorchVoice.synthesize`` on transformers' own modules, the same seed
and noise), the reference every streamed path must equal.

Variants: ``before`` (transformers' modules, the whole sentence's durations
before the first window, the first window of 12 frames: the code before these
benchmarks), ``after`` (this project's forwards, the durations of the first
``prior.PREFIX_IDS`` ids only, the default plan, products in float32),
``after_bfloat16`` (``--bfloat16``: ``after`` with its products in bfloat16,
compared with the float32 one-shot, so its audio differs by what bf16 changes),
``after_whole_prior`` (``--whole-prior``: ``after`` with the whole sentence's
durations first) and ``after_firstN`` for each ``--first-frames N``.

    python -m bench.tts.first_audio --utterances 24 --out bench/results/tts_first_audio_cpu.json
    # a machine without the tts extra: a converted voice folder and precomputed phonemes
    python -m bench.tts.first_audio --voice-dir /tmp/voice --phonemes bench/tts/phonemes.json ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bench.report import load_summary
from bench.tts.bench_tts import SENTENCES, summary_ms, write_report
from models.cpu_format import format_name
from models.tts.adapter import DecodeWindow, PiperTTS, SynthesizeSentence
from models.tts.phonemes import PhonemeTable
from models.tts.prior import PREFIX_IDS
from models.tts.stream import to_pcm16
from models.tts.voice import LatentRequest, TorchVoice
from models.tts.windows import WindowPlan

PIECES = ("phonemize", "text_encoder", "durations", "regulate_noise", "flow_prefix", "first_window", "pcm_checks")
GOAL_MS = 50.0


def log(msg: str) -> None:
    print("[first_audio %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


class Timers:
    """Seconds spent in wrapped callables since the last ``reset``."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def reset(self) -> None:
        self.spent = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t

        return timed


class _TimedEncoder:
    """A ``TextEncoder`` whose first-chunk call reports to ``timers`` (``rest`` untimed:
    it runs before the second window)."""

    def __init__(self, encoder: Any, timers: Timers) -> None:
        self._call = timers.wrap("text_encoder", encoder)
        self.rest = encoder.rest

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)


def make_variant(
    voice: TorchVoice, plan: WindowPlan, phonemes: PhonemeTable | None, timers: Timers, prefix_ids: int | None
) -> PiperTTS:
    """An adapter whose pieces report to ``timers`` (instance attributes only)."""
    tts = PiperTTS(voice, plan=plan, phonemizer=phonemes, max_batch=1, prefix_ids=prefix_ids)
    tts.phonemize = timers.wrap("phonemize", tts.phonemize)  # type: ignore[method-assign]
    voice.prior_prefix = timers.wrap("prior", voice.prior_prefix)  # type: ignore[method-assign]
    voice._log_durations = timers.wrap("durations", voice._log_durations)  # type: ignore[method-assign]
    voice.flow = timers.wrap("flow_prefix", voice.flow)  # type: ignore[method-assign]
    voice.decode = timers.wrap("first_window", voice.decode)  # type: ignore[method-assign]
    if voice._encoder is not None:
        voice._encoder = _TimedEncoder(voice._encoder, timers)  # type: ignore[assignment]
    return tts


def pieces_ms(spent: dict[str, float], total: float) -> dict[str, float]:
    enc = spent.get("text_encoder", 0.0)
    prior = spent["prior"]
    out = {
        "phonemize": spent["phonemize"],
        "text_encoder": enc,
        "durations": spent["durations"],
        "regulate_noise": prior - enc - spent["durations"],
        "flow_prefix": spent["flow_prefix"],
        "first_window": spent["first_window"],
    }
    out["pcm_checks"] = total - sum(out.values())
    return {k: v * 1e3 for k, v in out.items()}


class Variant:
    def __init__(
        self,
        name: str,
        voice: TorchVoice,
        plan: WindowPlan,
        phonemes: PhonemeTable | None,
        prefix_ids: int | None = PREFIX_IDS,
    ) -> None:
        self.name, self.timers = name, Timers()
        self.encoder_module = voice.model.text_encoder
        self.tts = make_variant(voice, plan, phonemes, self.timers, prefix_ids)
        self.ttfa: list[float] = []
        self.pieces: list[dict[str, float]] = []
        self.rtf: list[float] = []
        self.stalls: list[float] = []
        self.pcm_diff: list[int] = []
        self.length_equal: list[bool] = []

    def speak(self, text: str, seed: int, reference: np.ndarray | None) -> None:
        tts, sid = self.tts, "bench"
        voice = tts.voice
        if voice.reference:  # time transformers' encoder forward on this variant's calls only
            forward = self.encoder_module.forward
            self.encoder_module.forward = self.timers.wrap("text_encoder", forward)
        self.timers.reset()
        t0 = time.perf_counter()
        chunk = tts.run_batch([SynthesizeSentence(sid, 0, 0, text, 1.0, voice.spec.sample_rate, seed)])[0]
        first = time.perf_counter() - t0
        if voice.reference:
            self.encoder_module.forward = forward
        spent = dict(self.timers.spent)
        arrivals, pcm, samples = [(first, 0)], [chunk.pcm], chunk.samples
        while not chunk.done:
            chunk = tts.run_batch([DecodeWindow(sid, 0, 0)])[0]
            arrivals.append((time.perf_counter() - t0, samples))
            pcm.append(chunk.pcm)
            samples += chunk.samples
        total = time.perf_counter() - t0
        tts.release(sid)
        rate = voice.spec.sample_rate
        self.ttfa.append(first)
        self.pieces.append(pieces_ms(spent, first))
        self.rtf.append(total / (samples / rate))
        self.stalls.append(max(t - (first + before / rate) for t, before in arrivals))
        if reference is not None:
            got = np.frombuffer(b"".join(pcm), "<i2").astype(np.int32)
            self.length_equal.append(got.size == reference.size)
            if got.size == reference.size:
                self.pcm_diff.append(int(np.abs(got - reference).max()))

    def report(self) -> dict[str, Any]:
        plan = self.tts.plan
        out: dict[str, Any] = {
            "text_encoder": "transformers VitsTextEncoder" if self.tts.voice.reference else "models.tts.text_encoder",
            "products": format_name(self.tts.voice.products),
            "window_plan": dataclasses.asdict(plan),
            "durations_before_first_window": "whole sentence" if self.tts.prefix_ids is None
            else "first %d ids" % self.tts.prefix_ids,
            "ttfa_ms": summary_ms(self.ttfa),
            "pieces_ms_p50": {k: round(statistics.median(p[k] for p in self.pieces), 2) for k in PIECES},
            "rtf_p50": round(statistics.median(self.rtf), 4),
            "worst_stall_ms": round(max(self.stalls) * 1e3, 1),
            "utterances_with_stall_over_10ms": sum(1 for s in self.stalls if s > 0.010),
        }
        if self.length_equal:
            out["audio_vs_one_shot"] = {
                "same_length": "%d/%d" % (sum(self.length_equal), len(self.length_equal)),
                "max_abs_diff_pcm16_steps": max(self.pcm_diff) if self.pcm_diff else None,
            }
        return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utterances", type=int, default=24, help="timed utterances per variant")
    p.add_argument("--first-frames", type=int, nargs="*", default=[], help="also 'after' with these first windows")
    p.add_argument("--whole-prior", action="store_true",
                   help="also 'after' with the whole sentence's durations before the first window")
    p.add_argument("--bfloat16", action="store_true",
                   help="also 'after' with its products in bfloat16 (TorchVoice products=)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--voice-dir", default=None, help="a converted voice folder (no tts extra needed)")
    p.add_argument("--phonemes", default=None, help="precomputed phoneme ids (bench_tts --write-phonemes)")
    p.add_argument("--no-audio-check", action="store_true", help="skip the one-shot comparison")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    t = time.perf_counter()
    if args.voice_dir:
        from models.tts.piper_convert import load_converted

        model, spec = load_converted(Path(args.voice_dir), "cpu")
    else:
        from models.tts.piper_convert import load_voice_model

        model, spec, _ = load_voice_model(device="cpu")
    phonemes = None
    if args.phonemes:
        phonemes = PhonemeTable(json.loads(Path(args.phonemes).read_text(encoding="utf-8"))["texts"])
    log("voice loaded in %.2f s, torch threads %d" % (time.perf_counter() - t, torch.get_num_threads()))

    f32 = torch.float32  # the products' format; --bfloat16 adds a variant in the other
    variants = [
        Variant("before", TorchVoice(model, spec, reference=True), WindowPlan(12, 96, 11), phonemes, None),
        Variant("after", TorchVoice(model, spec, products=f32), WindowPlan(context_frames=11), phonemes),
    ]
    if args.bfloat16:
        bf16 = TorchVoice(model, spec, products=torch.bfloat16)
        variants.append(Variant("after_bfloat16", bf16, WindowPlan(context_frames=11), phonemes))
    if args.whole_prior:
        variants.append(Variant("after_whole_prior", TorchVoice(model, spec, products=f32), WindowPlan(context_frames=11),
                                phonemes, None))
    for n in args.first_frames:
        variants.append(Variant("after_first%d" % n, TorchVoice(model, spec, products=f32), WindowPlan(n, 96, 11), phonemes))

    # The one-shot reference per (sentence, seed), outside the timings.
    oneshot = TorchVoice(model, spec, reference=True)
    ref_tts = PiperTTS(oneshot, phonemizer=phonemes)
    references: dict[tuple[int, int], np.ndarray] = {}

    def reference(k: int, seed: int) -> np.ndarray | None:
        if args.no_audio_check:
            return None
        if (k, seed) not in references:
            ids = ref_tts.phonemize(SENTENCES[k])
            audio = oneshot.synthesize(LatentRequest(ids, 1.0, ref_tts.noise_scale, ref_tts.noise_w, seed))
            references[(k, seed)] = np.frombuffer(to_pcm16(audio.numpy()), "<i2").astype(np.int32)
        return references[(k, seed)]

    for k, text in enumerate(SENTENCES):  # warm-up: allocators, espeak, every window shape
        for v in variants:
            v.speak(text, 0, None)
        for v in variants:
            v.ttfa.clear(), v.pieces.clear(), v.rtf.clear(), v.stalls.clear()

    load_before = os.getloadavg()
    loads = [load_before[0]]
    for i in range(args.utterances):
        k, seed = i % len(SENTENCES), 100 + i
        ref = reference(k, seed)
        r = i % len(variants)
        for v in variants[r:] + variants[:r]:
            v.speak(SENTENCES[k], seed, ref)
        loads.append(os.getloadavg()[0])
        if (i + 1) % 6 == 0:
            log("%d/%d: %s, load %.2f" % (i + 1, args.utterances, ", ".join(
                "%s %.1f ms" % (v.name, statistics.median(v.ttfa) * 1e3) for v in variants), loads[-1]))
    load_after = os.getloadavg()

    results = {v.name: v.report() for v in variants}
    before = results["before"]["ttfa_ms"]["p50"]
    report: dict[str, Any] = {
        "benchmark": "tts_first_audio_ab",
        "description": __doc__.split("\n\n")[1].strip(),
        "sentences": list(SENTENCES),
        "utterances_per_variant": args.utterances,
        "results": results,
        "ratio_ttfa_p50_over_before": {n: round(r["ttfa_ms"]["p50"] / before, 3) for n, r in results.items()},
        "goal": {"adapter_ttfa_p50_ms_le": GOAL_MS,
                 "met": {n: r["ttfa_ms"]["p50"] <= GOAL_MS for n, r in results.items()}},
        "phonemes": "precomputed table (%s)" % args.phonemes if args.phonemes else "espeak-ng (piper-tts)",
        "load": load_summary(load_before, load_after, loads),
        "openmp_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                       if k in os.environ},
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    write_report(report, "bench.tts.first_audio", argv, args.out, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

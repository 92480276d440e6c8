"""What bfloat16 products do to the voice's audio, against float32 and ONNX Runtime.

``TorchVoice(products=torch.bfloat16)`` runs the text encoder's Q/K/V and
feed-forward products, the flow's and the windowed decoder's convs in bf16
(``models/tts/conv_matmul.py``); everything else stays float32. The server picks
it where this CPU has native bf16 and a timed pass is faster
(``models/cpu_format.py``). Three measurements over the same sentences:

1. **Noise off** (deterministic audio), streamed through ``PiperTTS`` in each
   format, against Piper's ONNX model through ONNX Runtime (the voice as its
   authors ship it, rounded to PCM16 as the stream is): equal length, waveform
   SNR and log-spectral distance (LSD, dB; frames of 1024 samples, hop 256,
   power floored at 1e-10).
2. **The voice's own noise** (noise_scale 0.667, noise_w 0.8, the defaults): the
   text encoder's prior means in bf16 moved by what fraction of the prior noise's
   standard deviation (exp(log sigma) * noise_scale) that every frame is drawn
   with anyway; and, with the same seed, whether the sentence's length (its
   durations) came out the same and the LSD between the two formats' audio.
3. The pass the pick times, in both formats.

    python -m bench.tts.products_quality --out bench/results/tts_products_quality_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch

from bench.tts.bench_tts import SENTENCES, write_report
from models.cpu_format import format_name, native_bf16, steady_ms
from models.tts.adapter import DecodeWindow, PiperTTS, SynthesizeSentence
from models.tts.stream import to_pcm16

MORE = (
    "Hello there, how are you today?",
    "Turn left at the second corridor, then keep going until you see the red door.",
    "It is twelve degrees outside and the wind is picking up.",
    "Please hold the line while I look up your order.",
    "The meeting moved to Thursday at three in the afternoon.",
    "Why would anyone paint a bridge bright orange?",
)
FORMATS = (torch.float32, torch.bfloat16)


def log(msg: str) -> None:
    print("[products_quality %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def stream(tts: PiperTTS, text: str, sid: str, seed: int) -> np.ndarray:
    """The sentence's PCM as ``realtime serve`` streams it, as float in [-1, 1]."""
    chunks = tts.run_batch([SynthesizeSentence(sid, 0, 0, text, 1.0, 22050, seed)])
    while not chunks[-1].done:
        chunks += tts.run_batch([DecodeWindow(sid, 0, 0)])
    return np.frombuffer(b"".join(c.pcm for c in chunks), "<i2").astype(np.float64) / 32768.0


def lsd_db(a: np.ndarray, b: np.ndarray) -> float:
    """Log-spectral distance over the common length (dB)."""
    n = min(a.size, b.size)
    window = torch.hann_window(1024, dtype=torch.float64)

    def power(x: np.ndarray) -> torch.Tensor:
        spec = torch.stft(torch.from_numpy(x[:n]), 1024, 256, window=window, return_complex=True)
        return 10 * torch.log10(spec.abs().square().clamp_min(1e-10))

    d = power(a) - power(b)
    return float(d.square().mean(dim=0).sqrt().mean())


def snr_db(got: np.ndarray, ref: np.ndarray) -> float | None:
    if got.size != ref.size:
        return None
    err = float(np.square(got - ref).sum())
    return round(10 * np.log10(float(np.square(ref).sum()) / max(err, 1e-30)), 1)


def summary(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the server's default: 1)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per sentence with the voice's noise on")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    from models.tts.piper_convert import find_joe_voice, load_voice_model
    from models.tts.voice import TorchVoice

    model, spec, _ = load_voice_model(device="cpu")
    voices = {dt: TorchVoice(model, spec, products=dt) for dt in FORMATS}
    quiet = {dt: PiperTTS(v, noise_scale=0.0, noise_w=0.0) for dt, v in voices.items()}
    noisy = {dt: PiperTTS(v) for dt, v in voices.items()}
    session = ort.InferenceSession(str(find_joe_voice().onnx_path), providers=["CPUExecutionProvider"])
    texts = list(SENTENCES) + list(MORE)
    names = {dt: format_name(dt) for dt in FORMATS}

    rows: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        ids = quiet[torch.float32].phonemize(text)
        feeds = {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                 "scales": np.array([0.0, 1.0, 0.0], np.float32)}
        # Rounded to PCM16 as the stream is, so the rounding is not counted as a difference.
        onnx_float = session.run(None, feeds)[0].reshape(-1)
        onnx = np.frombuffer(to_pcm16(onnx_float), "<i2").astype(np.float64) / 32768.0
        row: dict[str, Any] = {"text": text, "ids": len(ids), "onnx_samples": int(onnx.size)}
        for dt, tts in quiet.items():
            got = stream(tts, text, "q%d" % i, 0)
            row[names[dt]] = {"same_length": got.size == onnx.size, "snr_db": snr_db(got, onnx),
                              "lsd_db": round(lsd_db(got, onnx), 3)}
        # The voice's noise on: the encoder's means against the noise they are drawn with.
        tensor_ids = torch.tensor([ids])
        mask = torch.ones(1, len(ids), 1)
        enc = {dt: v._encoder(tensor_ids, mask) for dt, v in voices.items()}
        a, b = enc[torch.float32], enc[torch.bfloat16]
        sigma = torch.exp(a.log_variances) * noisy[torch.float32].noise_scale
        shift = ((a.means - b.means).abs() / sigma).flatten()
        row["prior_mean_shift_over_noise_sigma"] = {"mean": round(float(shift.mean()), 4),
                                                    "p99": round(float(shift.quantile(0.99)), 4),
                                                    "max": round(float(shift.max()), 4)}
        row["log_sigma_abs_shift_mean"] = round(float((a.log_variances - b.log_variances).abs().mean()), 5)
        same, lsd = 0, []
        for s in range(args.seeds):
            pair = [stream(noisy[dt], text, "n%d_%d" % (i, s), 1000 + s) for dt in FORMATS]
            if pair[0].size == pair[1].size:
                same += 1
                lsd.append(lsd_db(pair[1], pair[0]))
        row["noise_on"] = {"same_length": "%d/%d" % (same, args.seeds), "lsd_db_bf16_vs_f32": summary(lsd)}
        rows.append(row)
        log("%d/%d %s" % (i + 1, len(texts), {k: row[k] for k in ("float32", "bfloat16")}))

    passes = {names[dt]: round(steady_ms(lambda v=v: v._first_audio_pass(v._encoder, v._flow, v._decoder)), 2)
              for dt, v in voices.items()}
    report: dict[str, Any] = {
        "benchmark": "tts_products_quality",
        "description": __doc__.split("\n\n")[1].strip(),
        "native_bf16": native_bf16(),
        "sentences": len(texts),
        "noise_off_vs_onnx": {
            names[dt]: {
                "same_length": "%d/%d" % (sum(r[names[dt]]["same_length"] for r in rows), len(rows)),
                "snr_db": summary([r[names[dt]]["snr_db"] for r in rows if r[names[dt]]["snr_db"] is not None]),
                "lsd_db": summary([r[names[dt]]["lsd_db"] for r in rows]),
            }
            for dt in FORMATS
        },
        "noise_on": {
            "prior_mean_shift_over_noise_sigma_mean": summary([r["prior_mean_shift_over_noise_sigma"]["mean"] for r in rows]),
            "prior_mean_shift_over_noise_sigma_max": summary([r["prior_mean_shift_over_noise_sigma"]["max"] for r in rows]),
            "same_length": "%d/%d" % (sum(int(r["noise_on"]["same_length"].split("/")[0]) for r in rows),
                                      args.seeds * len(rows)),
            "lsd_db_bf16_vs_f32": summary([x for r in rows for x in
                                           ([r["noise_on"]["lsd_db_bf16_vs_f32"]["median"]]
                                            if r["noise_on"]["lsd_db_bf16_vs_f32"] else [])]),
        },
        "first_audio_pass_ms": passes,
        "rows": rows,
    }
    write_report(report, "bench.tts.products_quality", argv, args.out, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

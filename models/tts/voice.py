"""The converted Piper voice as two torch stages: latents once per sentence, then
HiFi-GAN windows.

``latents`` is VITS inference up to the decoder (text encoder, stochastic
duration predictor, length regulation, reverse flow), batched over sentences
with padding masks. ``decode`` runs windows of latents of any lengths in one
HiFi-GAN forward (``hifigan.decode_padded``). ``synthesize`` is the plain
whole-sentence path, the reference for parity and streaming tests.

Noise is drawn on the CPU from a generator seeded per sentence, so a sentence's
audio does not depend on what else shares its batch, nor on the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from models.tts.durations import DurationPredictor
from models.tts.flow import ReverseFlow
from models.tts.hifigan import decode_cores, decode_padded, decoder_geometry, receptive_field
from models.tts.hifigan_matmul import MAX_FRAMES as MATMUL_MAX_FRAMES, DecoderMatmul
from models.tts.piper_convert import VoiceSpec, load_converted, load_voice_model
from models.tts.text_encoder import TextEncoder

logger = logging.getLogger(__name__)


def flow_receptive_field(config) -> int:
    """Frames of context, each side, that one output frame of the reverse flow reads.

    Each coupling layer runs a WaveNet of ``L`` convs (kernel k, dilation
    rate**i, "same" padding) between two 1x1 convs; the flips between couplings
    only swap channels. So the reach is the sum over couplings and layers of
    (k - 1) * rate**i / 2 -- 4 couplings * 4 layers * 2 = 32 frames for joe.
    """
    k, rate = config.wavenet_kernel_size, config.wavenet_dilation_rate
    per_coupling = sum((k - 1) * rate**i // 2 for i in range(config.prior_encoder_num_wavenet_layers))
    return config.prior_encoder_num_flows * per_coupling


@dataclass(frozen=True)
class LatentRequest:
    """One sentence for the latent stage."""

    phoneme_ids: tuple[int, ...]
    length_scale: float = 1.0  # 1 / speed
    noise_scale: float = 0.667  # prior noise (timbre variation); 0 = deterministic
    noise_w: float = 0.8  # duration noise (rhythm variation); 0 = deterministic
    seed: int = 0


class TorchVoice:
    """A Piper VITS voice in torch. Owns its tensors; call from one thread."""

    def __init__(
        self, model: nn.Module, spec: VoiceSpec, device: str | torch.device = "cpu", reference: bool = False
    ) -> None:
        """``reference``: run transformers' own text encoder, duration predictor
        and flow forwards and the module decoder instead of
        ``text_encoder.TextEncoder``, ``durations.DurationPredictor``,
        ``flow.ReverseFlow`` and ``hifigan_matmul.DecoderMatmul`` (the same
        math, slower: the A of A/B runs and the tests' reference)."""
        self.model = model
        self.spec = spec
        self.device = torch.device(device)
        self.hop = spec.hop_length
        self.geometry = geometry = decoder_geometry(model.decoder)
        if geometry.hop != self.hop:
            raise ValueError("decoder hop %d != voice hop_length %d" % (geometry.hop, self.hop))
        self.context_left, self.context_right = receptive_field(geometry)
        self.flow_context = flow_receptive_field(model.config)
        self.channels = model.config.flow_size
        self.reference = reference
        self._encoder = None if reference else TextEncoder(model.text_encoder)
        self._flow = None if reference else ReverseFlow(model.flow)
        self._durations = None if reference else DurationPredictor(model.duration_predictor)
        use_matmul = not reference and DecoderMatmul.supports(model.decoder)
        self._decoder = DecoderMatmul(model.decoder, geometry) if use_matmul else None

    @classmethod
    def load(
        cls, device: str | torch.device = "cpu", cache_root: Path | None = None, reference: bool = False
    ) -> "TorchVoice":
        """The installed joe voice, converted on first use (needs the tts extra)."""
        model, spec, _ = load_voice_model(cache_root_dir=cache_root, device=device)
        return cls(model, spec, device, reference)

    @classmethod
    def load_dir(cls, directory: Path, device: str | torch.device = "cpu", reference: bool = False) -> "TorchVoice":
        """A converted cache directory on its own (no voice package, no onnx)."""
        model, spec = load_converted(directory, device)
        return cls(model, spec, device, reference)

    # --- latent stage -----------------------------------------------------------------

    @torch.inference_mode()
    def latents(self, requests: Sequence[LatentRequest]) -> list[torch.Tensor]:
        """Decoder input [C, T_i] for each request: ``prior`` then ``flow``."""
        return self.flow(self.prior(requests))

    @torch.inference_mode()
    def prior(self, requests: Sequence[LatentRequest]) -> list[torch.Tensor]:
        """The sampled prior z_p [C, T_i] (before the reverse flow) per request:
        text encoder, durations and length regulation, batched with padding."""
        if not requests:
            return []
        dev, model = self.device, self.model
        lengths = [len(r.phoneme_ids) for r in requests]
        if min(lengths) == 0:
            raise ValueError("empty phoneme id sequence")
        batch, t_in = len(requests), max(lengths)
        ids = torch.zeros(batch, t_in, dtype=torch.long)
        for b, r in enumerate(requests):
            ids[b, : lengths[b]] = torch.tensor(r.phoneme_ids)
        in_mask = (torch.arange(t_in)[None, :] < torch.tensor(lengths)[:, None]).to(dev)
        ids = ids.to(dev)
        gens = [torch.Generator().manual_seed(r.seed) for r in requests]

        padded = batch > 1 and min(lengths) != t_in
        if self._encoder is not None:
            out = self._encoder(ids, in_mask.unsqueeze(-1).float())
            hidden, means, log_vars = out.hidden, out.means, out.log_variances
        else:
            enc = model.text_encoder(
                input_ids=ids,
                padding_mask=in_mask.unsqueeze(-1).float(),
                attention_mask=in_mask.long() if padded else None,
            )
            hidden, means, log_vars = enc.last_hidden_state, enc.prior_means, enc.prior_log_variances
        hidden = hidden.transpose(1, 2)
        mask = in_mask.unsqueeze(1).float()  # [B, 1, T_in]

        # Duration noise first, then prior noise, from each sentence's generator.
        dur_noise = torch.zeros(batch, 2, t_in)
        for b, r in enumerate(requests):
            if r.noise_w:
                dur_noise[b, :, : lengths[b]] = torch.randn(2, lengths[b], generator=gens[b]) * r.noise_w
        log_w = self._log_durations(hidden, mask, dur_noise.to(dev))
        scale = torch.tensor([r.length_scale for r in requests], device=dev).view(batch, 1, 1)
        durations = torch.ceil(torch.exp(log_w) * mask * scale).long()[:, 0].cpu()  # [B, T_in]

        out = []
        for b, r in enumerate(requests):
            rep = durations[b, : lengths[b]]
            frames = int(rep.sum())
            if frames == 0:
                # Nothing to say: one silent frame, as VITS's clamp_min(1) gives.
                out.append(torch.zeros(self.channels, 1, device=dev))
                continue
            rep = rep.to(dev)
            # output_size: the length is known on the host, so CUDA need not sync for it.
            z_p = torch.repeat_interleave(means[b, : lengths[b]], rep, dim=0, output_size=frames).T
            if r.noise_scale:
                log_var = torch.repeat_interleave(
                    log_vars[b, : lengths[b]], rep, dim=0, output_size=frames
                ).T
                noise = torch.randn(z_p.shape, generator=gens[b]).to(dev)
                z_p = z_p + noise * torch.exp(log_var) * r.noise_scale
            out.append(z_p)
        return out

    @torch.inference_mode()
    def flow(
        self, items: Sequence[torch.Tensor], keep: Sequence[tuple[int, int]] | None = None
    ) -> list[torch.Tensor]:
        """The reverse flow over prior segments [C, L_i] of any lengths, in one
        padded forward; with ``keep``, only frames ``keep[i] = (a, b)`` of each
        (and only the work they need: ``flow.ReverseFlow`` crops between
        couplings). Padding does not reach a segment; a segment with
        ``flow_context`` frames of context on each side (or the sentence edge)
        reproduces the whole-sentence flow there."""
        if not items:
            return []
        if self._flow is not None:
            return self._flow(items, keep)
        lengths = [x.shape[-1] for x in items]
        longest = max(lengths)
        z_p = torch.zeros(len(items), self.channels, longest, device=self.device)
        for b, x in enumerate(items):
            z_p[b, :, : lengths[b]] = x
        mask = (torch.arange(longest, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None])
        z = self.model.flow(z_p, mask.unsqueeze(1).float(), None, reverse=True)
        spans = [(0, n) for n in lengths] if keep is None else keep
        return [z[b, :, a:e] for b, (a, e) in enumerate(spans)]

    def _log_durations(self, hidden: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """VitsStochasticDurationPredictor's reverse pass with the noise passed in
        (VitsModel draws it from the global RNG)."""
        if self._durations is not None:
            return self._durations(hidden, mask, noise)
        dp = self.model.duration_predictor
        x = dp.conv_pre(hidden)
        x = dp.conv_dds(x, mask)
        x = dp.conv_proj(x) * mask
        flows = list(reversed(dp.flows))
        flows = flows[:-2] + [flows[-1]]  # VITS skips one flow at inference
        latents = noise
        for flow in flows:
            latents = torch.flip(latents, [1])
            latents, _ = flow(latents, mask, global_conditioning=x, reverse=True)
        return latents[:, :1]

    # --- decoder stage ----------------------------------------------------------------

    @torch.inference_mode()
    def decode(
        self, windows: Sequence[torch.Tensor], cores: Sequence[tuple[int, int]] | None = None
    ) -> list[torch.Tensor]:
        """HiFi-GAN over latent windows [C, T_i] of any lengths, in one forward.

        Returns audio [T_i * hop] per window, or with ``cores`` only the samples
        ``cores[i] = (a, b)`` of window i, computed without the activations
        they cannot read (``hifigan.decode_cores``). On the voice's device.
        """
        if not windows:
            return []
        lengths = [w.shape[-1] for w in windows]
        longest = max(lengths)
        if len(windows) == 1:
            batch = windows[0][None]
        else:
            batch = torch.zeros(len(windows), self.channels, longest, device=self.device)
            for b, w in enumerate(windows):
                batch[b, :, : lengths[b]] = w
        if cores is not None:
            if self._decoder is not None and longest <= MATMUL_MAX_FRAMES:
                return self._decoder.decode_cores(batch, lengths, cores)
            return decode_cores(self.model.decoder, self.geometry, batch, lengths, cores)
        audio = decode_padded(self.model.decoder, batch, lengths)
        return [audio[b, : lengths[b] * self.hop] for b in range(len(windows))]

    @torch.inference_mode()
    def decode_whole(self, z: torch.Tensor) -> torch.Tensor:
        """transformers' own decoder forward over a whole sentence [C, T]."""
        return self.model.decoder(z[None])[0, 0]

    def synthesize(self, request: LatentRequest) -> torch.Tensor:
        """Whole-sentence audio [T * hop] in [-1, 1]: latents, then one decode."""
        return self.decode_whole(self.latents([request])[0])

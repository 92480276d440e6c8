"""The converted Piper voice as two torch stages: latents once per sentence, then
HiFi-GAN windows.

The latent stage is VITS inference up to the decoder (text encoder, stochastic
duration predictor, length regulation, reverse flow), batched over sentences
with padding masks; a stream takes the prior in two steps (``prior_prefix``,
``prior_rest``; see ``models.tts.piper.prior``) and runs ``flow`` over just the
frames its next window reads. ``decode`` runs windows of latents of any lengths
in one HiFi-GAN forward (``hifigan.decode_padded``). The tests hold all of it to
the plain whole-sentence path (``tests/models/tts_piper/piper_reference.py``).

Noise is drawn on the CPU from a generator seeded per sentence, so a sentence's
audio does not depend on what else shares its batch, nor on the device.

The products of the text encoder, the flow and the windowed decoder run in one
number format (``products``): float32, or bfloat16 on a CPU with native bf16
where a timed first-audio pass finds it faster (``models.cpu_format``). What
bfloat16 does to the audio is measured in the model card
(``bench/results/tts_products_quality_cpu.json``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from models.cpu_format import faster_format, native_bf16, steady_ms
from models.tts.piper.convert import VoiceSpec, load_converted, load_voice_model
from models.tts.piper.durations import DurationPredictor
from models.tts.piper.flow import ReverseFlow
from models.tts.piper.hifigan import decode_cores, decode_padded, decoder_geometry, receptive_field
from models.tts.piper.hifigan_matmul import MAX_FRAMES as MATMUL_MAX_FRAMES, DecoderMatmul
from models.tts.piper.prior import PREFIX_IDS, Segment, SentencePrior, duration_reach, prefix_segment, rest_segment
from models.tts.piper.text_encoder import TextEncoder

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
        self,
        model: nn.Module,
        spec: VoiceSpec,
        device: str | torch.device = "cpu",
        reference: bool = False,
        products: torch.dtype | None = None,
    ) -> None:
        """``reference``: run transformers' own text encoder, duration predictor
        and flow forwards and the module decoder instead of
        ``text_encoder.TextEncoder``, ``durations.DurationPredictor``,
        ``flow.ReverseFlow`` and ``hifigan_matmul.DecoderMatmul`` (the same
        math, slower: the A of A/B runs and the tests' reference).
        ``products``: their number format; None picks (see the module doc)."""
        self.model = model
        self.spec = spec
        self.device = torch.device(device)
        self.hop = spec.hop_length
        self.geometry = geometry = decoder_geometry(model.decoder)
        if geometry.hop != self.hop:
            raise ValueError("decoder hop %d != voice hop_length %d" % (geometry.hop, self.hop))
        self.context_left, self.context_right = receptive_field(geometry)
        self.flow_context = flow_receptive_field(model.config)
        self.duration_reach = duration_reach(model.duration_predictor)
        self.channels = model.config.flow_size
        self.reference = reference
        self._durations = None if reference else DurationPredictor(model.duration_predictor)
        self.products_pick: dict[str, Any] | None = None
        self._encoder: TextEncoder | None = None
        self._flow: ReverseFlow | None = None
        self._decoder: DecoderMatmul | None = None
        if reference:
            self.products = torch.float32
        elif products is None and self.device.type == "cpu" and native_bf16():
            both = {dt: self._forwards(dt) for dt in (torch.float32, torch.bfloat16)}
            passes = {dt: (lambda f=f: steady_ms(lambda: self._first_audio_pass(*f), repeats=3)) for dt, f in both.items()}
            self.products, self.products_pick = faster_format("tts", passes)
            self._encoder, self._flow, self._decoder = both[self.products]
        else:
            self.products = products or torch.float32
            self._encoder, self._flow, self._decoder = self._forwards(self.products)

    def _forwards(self, products: torch.dtype) -> tuple[TextEncoder, ReverseFlow, DecoderMatmul | None]:
        model = self.model
        decoder = DecoderMatmul(model.decoder, self.geometry, products) if DecoderMatmul.supports(model.decoder) else None
        return TextEncoder(model.text_encoder, products), ReverseFlow(model.flow, products), decoder

    @torch.inference_mode()
    def _first_audio_pass(self, encoder: TextEncoder, flow: ReverseFlow, decoder: DecoderMatmul | None) -> None:
        """The products a sentence's first audio waits for, on fixed inputs of a
        typical sentence (215 ids, the prefix's 100 rows, a 55-frame flow, a 23-frame window)."""
        ids = torch.ones(1, 215, dtype=torch.long)
        encoder(ids, torch.ones(1, 215, 1), rows=100)
        (z,) = flow([torch.zeros(self.channels, 55)])
        if decoder is not None:
            decoder.decode_cores(z[None, :, :23], [23], [(0, 12)])

    @classmethod
    def load(
        cls,
        device: str | torch.device = "cpu",
        cache_root: Path | None = None,
        reference: bool = False,
        products: torch.dtype | None = None,
    ) -> "TorchVoice":
        """The installed joe voice, converted on first use (needs the tts extra)."""
        model, spec, _ = load_voice_model(cache_root_dir=cache_root, device=device)
        return cls(model, spec, device, reference, products)

    @classmethod
    def load_dir(
        cls,
        directory: Path,
        device: str | torch.device = "cpu",
        reference: bool = False,
        products: torch.dtype | None = None,
    ) -> "TorchVoice":
        """A converted cache directory on its own (no voice package, no onnx)."""
        model, spec = load_converted(directory, device)
        return cls(model, spec, device, reference, products)

    # --- latent stage -----------------------------------------------------------------

    @torch.inference_mode()
    def prior_prefix(self, requests: Sequence[LatentRequest], prefix: int | None = PREFIX_IDS) -> list[SentencePrior]:
        """The text encoder over each whole sentence, the durations of its first
        ``prefix`` ids only (``prior.prefix_segment``; None: all) and their
        frames. Short sentences come back ``complete``; ``prior_rest`` completes
        the others."""
        return [self._one_frame_if_empty(p) for p in self._start(requests, prefix)]

    @torch.inference_mode()
    def prior_rest(self, priors: Sequence[SentencePrior]) -> None:
        """Complete each unfinished prior: the text encoder's last layer for its
        remaining ids (one sentence at a time), then their durations (with
        ``duration_reach`` ids of context before them) in one padded batch."""
        todo = [p for p in priors if not p.complete]
        for p in todo:
            if p.last_input is not None:
                start = p.hidden.shape[0]
                out = self._encoder.rest(p.last_input, start)
                p.hidden = torch.cat([p.hidden, out.hidden[0]])
                p.means = torch.cat([p.means, out.means[0]])
                p.log_variances = torch.cat([p.log_variances, out.log_variances[0]])
                p.last_input = None
        segments = [rest_segment(p.length, p.ids_done, self.duration_reach) for p in todo]
        for p, durations in zip(todo, self._segment_durations(todo, segments)):
            p.extend(durations)
        for p in todo:
            self._one_frame_if_empty(p)

    def _start(self, requests: Sequence[LatentRequest], prefix: int | None) -> list[SentencePrior]:
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

        padded = batch > 1 and min(lengths) != t_in
        last_input = None
        if self._encoder is not None:
            # The prefix segments read the encoder's first prefix + reach positions only.
            rows = None if prefix is None else prefix + self.duration_reach
            out = self._encoder(ids, in_mask.unsqueeze(-1).float(), rows)
            hidden, means, log_vars, last_input = out.hidden, out.means, out.log_variances, out.last_input
        else:
            enc = model.text_encoder(
                input_ids=ids,
                padding_mask=in_mask.unsqueeze(-1).float(),
                attention_mask=in_mask.long() if padded else None,
            )
            hidden, means, log_vars = enc.last_hidden_state, enc.prior_means, enc.prior_log_variances

        priors = []
        for b, r in enumerate(requests):
            n = lengths[b]
            gen = torch.Generator().manual_seed(r.seed)
            # Duration noise first, then the prior noise blocks, from the sentence's generator.
            dur_noise = torch.randn(2, n, generator=gen) * r.noise_w if r.noise_w else torch.zeros(2, n)
            pending = last_input is not None and n > hidden.shape[1]
            priors.append(
                SentencePrior(
                    n, r.length_scale, r.noise_scale, means[b, :n], log_vars[b, :n], hidden[b, :n],
                    dur_noise.to(dev), gen, torch.zeros(self.channels, 0, device=dev),
                    last_input=last_input[b : b + 1, :n] if pending else None,
                )
            )
        segments = [
            Segment(0, p.length, 0, p.length) if prefix is None else prefix_segment(p.length, prefix, self.duration_reach)
            for p in priors
        ]
        for p, durations in zip(priors, self._segment_durations(priors, segments)):
            p.extend(durations)
        return priors

    def _segment_durations(self, priors: Sequence[SentencePrior], segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Durations (long, on the host) of each segment's kept ids, one padded SDP call."""
        if not priors:
            return []
        dev = self.device
        sizes = [s.hi - s.lo for s in segments]
        batch, longest = len(priors), max(sizes)
        hidden = torch.zeros(batch, longest, priors[0].hidden.shape[-1], device=dev)
        noise = torch.zeros(batch, 2, longest, device=dev)
        for b, (p, s) in enumerate(zip(priors, segments)):
            hidden[b, : sizes[b]] = p.hidden[s.lo : s.hi]
            noise[b, :, : sizes[b]] = p.duration_noise[:, s.lo : s.hi]
        mask = (torch.arange(longest, device=dev)[None, :] < torch.tensor(sizes, device=dev)[:, None])
        mask = mask.unsqueeze(1).float()  # [B, 1, T]
        log_w = self._log_durations(hidden.transpose(1, 2), mask, noise)
        scale = torch.tensor([p.length_scale for p in priors], device=dev).view(batch, 1, 1)
        durations = torch.ceil(torch.exp(log_w) * mask * scale).long()[:, 0].cpu()  # [B, T]
        return [durations[b, s.keep_lo - s.lo : s.keep_hi - s.lo] for b, s in enumerate(segments)]

    def silence(self) -> SentencePrior:
        """A complete prior with no frames (a sentence with nothing to say)."""
        dev = self.device
        empty = torch.zeros(0, self.channels, device=dev)
        nothing = torch.zeros(self.channels, 0, device=dev)
        return SentencePrior(0, 1.0, 0.0, empty, empty, empty, torch.zeros(2, 0), torch.Generator(), nothing)

    def _one_frame_if_empty(self, p: SentencePrior) -> SentencePrior:
        if p.complete and p.frames == 0:
            # Nothing to say: one silent frame, as VITS's clamp_min(1) gives.
            p.z_p = torch.zeros(self.channels, 1, device=self.device)
        return p

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

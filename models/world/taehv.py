"""TAEHV's decoder for Wan 2.1 latents: one streaming state per session, sessions batched.

TAEHV (madebyollin/taehv, MIT) is a tiny all-2D-conv video autoencoder; its
``taew2_1.pth`` decodes the latents of the Wan 2.1 VAE (16 channels, also the VAE
of Wan 2.2 A14B, hence of LingBot-World v2) at a small fraction of the Wan VAE's
cost and quality. This module is the decoder only, written here from the public
architecture, and an exact loader of the public file (encoder tensors checked,
then dropped). The file itself is not shipped or downloaded: the operator names it.

The decoder (``decoder.N`` is the key prefix of layer N in the file)::

    0      Clamp        tanh(x / 3) * 3             latent h x w, 16 channels
    1, 2   conv 16->256 (3x3, bias), ReLU
    3-5    3 MemBlock(256)                          h x w
    6, 7   nearest x2, TGrow(256, stride 1)
    8      conv 256->128 (no bias)
    9-11   3 MemBlock(128)                          2h x 2w
    12, 13 nearest x2, TGrow(128, stride 2)         2 frames per latent frame
    14     conv 128->64 (no bias)
    15-17  3 MemBlock(64)                           4h x 4w
    18, 19 nearest x2, TGrow(64, stride 2)          4 frames per latent frame
    20-22  conv 64->64 (no bias), ReLU, conv 64->3 (bias)   8h x 8w, RGB in [0, 1]

A MemBlock sees its own input one frame back (zeros before a session's first
frame): ``relu(convs(cat[x_t, x_t-1]) + x_t)``, three 3x3 convs (the first from
2C channels) with ReLUs between. TGrow is a 1x1 conv to stride x C channels whose
channel groups become consecutive frames. So each latent frame decodes to 4
frames, and a session's first 3 frames are dropped (they are still computed: the
MemBlocks remember them) to match Wan's 1 + 4n framing: the first latent frame
gives 1 frame, every later one 4, as ``StreamingWanDecoder`` does.

Per session the state is the 9 MemBlocks' last inputs::

    3 x [B, 256,  h,  w] + 3 x [B, 128, 2h, 2w] + 3 x [B, 64, 4h, 4w]
    480 x 832 (h, w = 60, 104), B = 1: 33,546,240 values, 67,092,480 bytes in fp16/bf16

Conventions, from the reference's README and its diffusers wrapper: the input is
the diffusion model's latents as they are, *without* the Wan VAE's
``latents_mean`` / ``latents_std`` (the wrapper sets mean 0, std 1); the reference
outputs [0, 1] and clamps there. Here latents come in as ``[B, 16, T, h, w]`` and
frames go out in [-1, 1] as ``[B, 3, T_out, H, W]`` (``2 * x - 1`` after the clamp),
the Wan decoder's layout and range, so a caller of either converts pixels alike.

API (one owner thread; a session owns one state; the state is ``WanDecodeState``,
the container the Wan decoder uses, so residency and the pipeline treat both alike)::

    dec = load_taehv("/models/taew2_1.pth", device="cuda", dtype=torch.float16)
    nbytes = dec.state_bytes(1, 60, 104)          # capacity: model_state_bytes
    state = dec.new_state(1, 60, 104)             # zeros
    for frame in dec.frames(state, z_block):      # z_block [1, 16, T, 60, 104], normalised
        send(frame)                               # [1, 3, 480, 832] in [-1, 1]
    video = dec.decode(state, z_next)             # [1, 3, T_out, 480, 832], one pass
    for rows, video in dec.frames_batch(states, z_rows):   # many sessions' rows, one pass a latent frame
        send(rows, video)                         # [len(rows), 3, t, 480, 832]
    videos = dec.decode_batch(states, z_rows)     # one pass for all rows: row r [3, T_out, 480, 832]
    state.reset(); state.free()

``frames`` runs one latent frame at a time (the first frame is out after one
latent frame's work); ``decode`` runs the block's latent frames in one pass,
batched over time. Both give what one decode of the session's whole latent video
gives (to float rounding: the convolutions see other batch sizes). The batched
calls read and write each session's own state tensors in place (no stacked copy),
and mix a session's first block with later ones in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from models.world.wan_vae import WanDecodeState, by_row, check_rows, rows_apart

LATENT_CHANNELS = 16
#: Decoder widths: stage s runs at WIDTHS[s] and ends in a conv to WIDTHS[s + 1].
WIDTHS = (256, 128, 64, 64)
#: TGrow strides per stage (the reference's decoder_time_upscale (False, True, True)).
TIME_STRIDES = (1, 2, 2)
MEMBLOCKS_PER_STAGE = 3
#: Frames a session's first latent frame makes that Wan's framing does not have.
TRIM_FRAMES = 3
ENCODER_WIDTH = 64
#: TPool strides per encoder stage (encoder_time_downscale (True, True, False)).
ENCODER_TIME_POOLS = (2, 2, 1)


# -- the public layout -----------------------------------------------------------------


def _memblock_shapes(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.conv.0.weight": (c, 2 * c, 3, 3), f"{prefix}.conv.0.bias": (c,),
            f"{prefix}.conv.2.weight": (c, c, 3, 3), f"{prefix}.conv.2.bias": (c,),
            f"{prefix}.conv.4.weight": (c, c, 3, 3), f"{prefix}.conv.4.bias": (c,)}


def taew2_1_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the public ``taew2_1.pth``, in the file's order: 64 encoder and
    64 decoder tensors, 11,315,539 values (22.6 MB in fp16)."""
    e = ENCODER_WIDTH
    shapes: dict[str, tuple[int, ...]] = {"encoder.0.weight": (e, 3, 3, 3), "encoder.0.bias": (e,)}
    i = 2   # encoder.1 is a ReLU; each stage is TPool, stride-2 conv, 3 MemBlocks
    for pool in ENCODER_TIME_POOLS:
        shapes[f"encoder.{i}.conv.weight"] = (e, e * pool, 1, 1)
        shapes[f"encoder.{i + 1}.weight"] = (e, e, 3, 3)
        for k in range(MEMBLOCKS_PER_STAGE):
            shapes.update(_memblock_shapes(f"encoder.{i + 2 + k}", e))
        i += 2 + MEMBLOCKS_PER_STAGE
    shapes[f"encoder.{i}.weight"] = (LATENT_CHANNELS, e, 3, 3)
    shapes[f"encoder.{i}.bias"] = (LATENT_CHANNELS,)

    shapes["decoder.1.weight"] = (WIDTHS[0], LATENT_CHANNELS, 3, 3)
    shapes["decoder.1.bias"] = (WIDTHS[0],)
    i = 3   # decoder.0 is the clamp, decoder.2 a ReLU
    for s, stride in enumerate(TIME_STRIDES):
        c = WIDTHS[s]
        for k in range(MEMBLOCKS_PER_STAGE):
            shapes.update(_memblock_shapes(f"decoder.{i + k}", c))
        i += MEMBLOCKS_PER_STAGE + 1                    # then the upsample
        shapes[f"decoder.{i}.conv.weight"] = (c * stride, c, 1, 1)
        shapes[f"decoder.{i + 1}.weight"] = (WIDTHS[s + 1], c, 3, 3)
        i += 2
    shapes[f"decoder.{i + 1}.weight"] = (3, WIDTHS[-1], 3, 3)   # decoder.{i} is a ReLU
    shapes[f"decoder.{i + 1}.bias"] = (3,)
    return shapes


# -- layers --------------------------------------------------------------------------------


def _conv3(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class _Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class _MemBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(_conv3(2 * c, c), nn.ReLU(inplace=True), _conv3(c, c),
                                  nn.ReLU(inplace=True), _conv3(c, c))

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, past], 1)) + x)


class _TGrow(nn.Module):
    def __init__(self, c: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(c, c * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [N, s*C, H, W] -> [N*s, C, H, W]: channel group j is the frame j of the s.
        return self.conv(x).reshape(-1, *x.shape[1:])


class TAEHVDecoder(nn.Module):
    """The taew2_1 decoder; its ``state_dict`` keys are the file's ``decoder.*`` keys."""

    latent_channels = LATENT_CHANNELS
    #: How a batch of sessions' rows runs its convolutions (``wan_vae.rows_apart``; None: apart on CPU).
    batch_invariant: bool | None = None
    #: Output frames per latent frame after a session's first.
    temporal_upsample = math.prod(TIME_STRIDES)
    #: Pixels per latent pixel along height and width.
    spatial_upsample = 2 ** len(TIME_STRIDES)

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [_Clamp(), _conv3(LATENT_CHANNELS, WIDTHS[0]), nn.ReLU(inplace=True)]
        for s, stride in enumerate(TIME_STRIDES):
            layers += [_MemBlock(WIDTHS[s]) for _ in range(MEMBLOCKS_PER_STAGE)]
            layers += [nn.Upsample(scale_factor=2), _TGrow(WIDTHS[s], stride),
                       _conv3(WIDTHS[s], WIDTHS[s + 1], bias=False)]
        layers += [nn.ReLU(inplace=True), _conv3(WIDTHS[-1], 3)]
        self.decoder = nn.Sequential(*layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder[1].weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder[1].weight.device

    # -- sizes ---------------------------------------------------------------------------

    @staticmethod
    def state_shapes(batch: int, latent_height: int, latent_width: int) -> list[tuple[int, ...]]:
        """Shapes of a state's tensors (each MemBlock's last input), in the decoder's order."""
        return [(batch, WIDTHS[s], latent_height << s, latent_width << s)
                for s in range(len(TIME_STRIDES)) for _ in range(MEMBLOCKS_PER_STAGE)]

    def state_bytes(self, batch: int, latent_height: int, latent_width: int) -> int:
        """Bytes of one state at this geometry in the decoder's dtype (capacity planning)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return sum(itemsize * b * c * h * w for b, c, h, w in self.state_shapes(batch, latent_height, latent_width))

    def output_frames(self, latent_frames_before: int, latent_frames: int) -> int:
        """Output frames that ``latent_frames`` more latent frames decode to."""
        first = 1 if latent_frames_before == 0 and latent_frames > 0 else 0
        return first + self.temporal_upsample * (latent_frames - first)

    # -- state ---------------------------------------------------------------------------

    def new_state(self, batch: int, latent_height: int, latent_width: int,
                  device: torch.device | str | None = None) -> WanDecodeState:
        """A fresh state (zeros: every MemBlock's past before a session's first frame)."""
        device = self.device if device is None else torch.device(device)
        caches = [torch.zeros(s, dtype=self.dtype, device=device)
                  for s in self.state_shapes(batch, latent_height, latent_width)]
        return WanDecodeState(caches, batch, (latent_height, latent_width))

    # -- decode --------------------------------------------------------------------------

    @torch.no_grad()
    def frames(self, state: WanDecodeState, z: torch.Tensor) -> Iterator[torch.Tensor]:
        """Decode ``z`` [B, 16, T, h, w] after the state's past, one latent frame at a time;
        yield each output frame [B, 3, H, W] in [-1, 1] as soon as its latent frame is done."""
        self._check(state, z)
        for i in range(z.shape[2]):
            out = self._advance(state, z[:, :, i:i + 1])
            for j in range(out.shape[2]):
                yield out[:, :, j]

    @torch.no_grad()
    def decode(self, state: WanDecodeState, z: torch.Tensor) -> torch.Tensor:
        """Decode a whole block in one pass: ``[B, 3, T_out, H, W]`` in [-1, 1]."""
        self._check(state, z)
        return self._advance(state, z)

    def frames_batch(self, states: Sequence[WanDecodeState],
                     z: torch.Tensor) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Decode row ``r`` of ``z`` [R, 16, T, h, w] after ``states[r]``'s past (each a one-row
        state of its own session), all rows in one pass per latent frame; yield ``(rows, video
        [len(rows), 3, t, H, W])`` as each latent frame is done.

        Rows at a session's first latent frame and later rows run in the same pass (the
        decoder does the same work for both; a first latent frame's first 3 frames are then
        dropped), yielded as two groups, first rows first. Each row equals its session decoded
        alone: bit for bit where its convolutions run apart (``rows_apart``: CPU), to float
        rounding where all rows share them (CUDA; tests/models/world/test_batched_decode.py).
        One row is ``frames`` itself, one frame per yield, bit for bit. Refuses (``ValueError``)
        before any state moves."""
        check_rows(states, z, LATENT_CHANNELS)
        if len(states) == 1:
            return (([0], f.unsqueeze(2)) for f in self.frames(states[0], z))
        return self._frames_batch(states, z)

    @torch.no_grad()
    def decode_batch(self, states: Sequence[WanDecodeState], z: torch.Tensor) -> list[torch.Tensor]:
        """Decode a whole block of every row in one pass: row ``r``'s ``[3, T_out, H, W]``.
        One row is ``decode`` itself."""
        check_rows(states, z, LATENT_CHANNELS)
        if len(states) == 1:
            return [self.decode(states[0], z)[0]]
        videos: dict[int, torch.Tensor] = {}
        for rows, video in self._advance_rows(states, z):
            videos.update(zip(rows, video))
        return [videos[r] for r in range(len(states))]

    @torch.no_grad()
    def _frames_batch(self, states: Sequence[WanDecodeState],
                      z: torch.Tensor) -> Iterator[tuple[list[int], torch.Tensor]]:
        for i in range(z.shape[2]):
            yield from self._advance_rows(states, z[:, :, i:i + 1])

    def _advance_rows(self, states: Sequence[WanDecodeState],
                      z: torch.Tensor) -> list[tuple[list[int], torch.Tensor]]:
        first = [r for r, s in enumerate(states) if s.latent_frames == 0]
        later = [r for r, s in enumerate(states) if s.latent_frames > 0]
        memory = list(zip(*(s.caches for s in states)))   # per MemBlock, the rows' own tensors
        x = self._run(memory, z.to(self.dtype).transpose(1, 2))
        x = x.clamp(0, 1).mul(2).sub(1).transpose(1, 2)
        for s in states:
            s.latent_frames += z.shape[2]
        if not first:
            return [(later, x)]
        if not later:
            return [(first, x[:, :, TRIM_FRAMES:])]
        return [(first, x[first][:, :, TRIM_FRAMES:]), (later, x[later])]

    def _check(self, state: WanDecodeState, z: torch.Tensor) -> None:
        if (z.dim() != 5 or z.shape[0] != state.batch or z.shape[1] != LATENT_CHANNELS or z.shape[2] < 1
                or tuple(z.shape[3:]) != state.latent_hw):
            raise ValueError(f"latents {tuple(z.shape)} do not match the state (batch {state.batch}, "
                             f"{LATENT_CHANNELS} channels, 1 or more frames, latent {state.latent_hw})")

    def _advance(self, state: WanDecodeState, z: torch.Tensor) -> torch.Tensor:
        first = state.latent_frames == 0
        x = self._run(state.caches, z.to(self.dtype).transpose(1, 2))   # [B, 4T, 3, H, W]
        x = x.clamp(0, 1).mul(2).sub(1).transpose(1, 2)
        state.latent_frames += z.shape[2]
        return x[:, :, TRIM_FRAMES:] if first else x

    def _run(self, memory: list[torch.Tensor] | list[tuple[torch.Tensor, ...]], x: torch.Tensor) -> torch.Tensor:
        """The decoder over ``x`` [B, T, C, h, w], parallel in time (frames flattened b-major
        into the conv batch), each MemBlock's past being its input one frame back: the
        memory for this call's first frame, then the frames before. Advances ``memory``:
        per MemBlock one ``[B, C, h, w]`` tensor, or a tuple of B ``[1, C, h, w]`` tensors,
        one per row (sessions' own states, read and written in place)."""
        b, t = x.shape[:2]
        h = x.flatten(0, 1)
        mem = iter(memory)
        rows = not isinstance(memory[0], torch.Tensor)
        split = b if rows and rows_apart(self.batch_invariant, x.device) else 1   # ``by_row``
        for layer in self.decoder:
            if isinstance(layer, _MemBlock):
                m = next(mem)                                      # [B, C, h, w]
                seq = h.unflatten(0, (b, t))
                if isinstance(m, torch.Tensor):
                    past = torch.cat([m.unsqueeze(1), seq[:, :-1]], 1).flatten(0, 1)
                    m.copy_(seq[:, -1])
                else:
                    # Where torch.cat puts the memory, each row's own: the copies one row
                    # makes alone, and no stacked copy of the states.
                    past = torch.empty_like(seq)
                    past[:, 1:] = seq[:, :-1]
                    for r, row in enumerate(m):
                        past[r, 0] = row[0]
                        row.copy_(seq[r:r + 1, -1])
                    past = past.flatten(0, 1)
                h = by_row(layer, split, h, past)
            else:
                h = by_row(layer, split, h)
                if isinstance(layer, _TGrow):
                    t *= layer.stride
        return h.unflatten(0, (b, t))


# -- loading -------------------------------------------------------------------------------


def check_layout(state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` naming the first key that breaks the taew2_1 layout: an unknown
    or missing tensor, a wrong shape, a non-float dtype or a non-finite value."""
    expected = taew2_1_shapes()
    unknown = sorted(set(state_dict) - set(expected))
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ValueError(f"unknown tensor {unknown[0]!r}{more}: not in the taew2_1 layout")
    missing = [k for k in expected if k not in state_dict]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"missing tensor {missing[0]!r}{more} of the taew2_1 layout")
    for key, shape in expected.items():
        t = state_dict[key]
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{key!r} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != shape:
            raise ValueError(f"tensor {key!r} has shape {tuple(t.shape)}, the taew2_1 layout has {shape}")
        if not t.is_floating_point():
            raise ValueError(f"tensor {key!r} is {t.dtype}, not floating point")
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {key!r} has non-finite values")


def taehv_from_state_dict(state_dict: Mapping[str, torch.Tensor], *, device: torch.device | str = "cpu",
                          dtype: torch.dtype = torch.float32) -> TAEHVDecoder:
    """The decoder from a state dict in the exact taew2_1 layout (``check_layout``): every
    tensor is consumed, the 64 ``decoder.*`` into the model, the 64 ``encoder.*`` checked only."""
    check_layout(state_dict)
    with torch.device("meta"):
        model = TAEHVDecoder()
    weights = {k: v.to(dtype) for k, v in state_dict.items() if k.startswith("decoder.")}
    model.load_state_dict(weights, strict=True, assign=True)
    return model.to(device).eval().requires_grad_(False)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A ``.pth`` (``torch.load``, tensors only) or ``.safetensors`` file's named tensors."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(p))
        else:
            sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:   # any reader error is a bad file, said in one line
        first_line = (str(e).strip().splitlines() or [""])[0][:120]
        raise ValueError(f"{p}: not a readable state dict ({type(e).__name__}: {first_line})") from None
    if not isinstance(sd, Mapping) or not all(isinstance(k, str) for k in sd):
        raise ValueError(f"{p}: not a state dict (a {type(sd).__name__})")
    return dict(sd)


def load_taehv(path: str | Path, *, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> TAEHVDecoder:
    """The decoder of a ``taew2_1.pth`` (or ``.safetensors``) file; ``ValueError`` naming the
    path and the offending key for any other layout."""
    sd = read_state_dict(path)
    try:
        return taehv_from_state_dict(sd, device=device, dtype=dtype)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def random_state_dict(seed: int = 0, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """Random tensors in the exact taew2_1 layout (tests and timings): weights
    N(0, 1 / fan_in), biases N(0, 0.1^2), so activations stay in range."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in taew2_1_shapes().items():
        if key.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[1] * shape[2] * shape[3]
            t = torch.randn(shape, generator=g) / fan_in ** 0.5
        out[key] = t.to(dtype)
    return out

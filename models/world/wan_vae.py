"""Streaming causal decode of Wan VAE latents: one state per session, sessions batched.

The Wan 2.1 VAE decoder (``diffusers.AutoencoderKLWan``) is causal in time: every
3-tap temporal convolution sees the current frames plus the last two frames of
its own input, and diffusers' one-shot ``decode`` already walks the latent video
one latent frame at a time, keeping those past frames in a ``feat_cache`` list.
A world model makes its latents block by block (a tick), so here that cache is
per-session state that outlives a call: decoding block 1, then block 2, ... of a
session gives exactly the frames a one-shot decode of the concatenated latents
gives (bit for bit in float32; tests/models/world/test_wan_vae.py).

How the cache works (one causal conv, input frames x_t of one step)::

    cache (2 frames)   step input (t frames)     conv input (t+2 frames)
    [c0, c1]         + [x0 .. x_t-1]          -> [c0, c1, x0 .. x_t-1]  -> conv, no time pad
    new cache = the last 2 frames of the conv input

The first step of a session sees zeros as its past (diffusers pads with two zero
frames), so every cache starts as zeros and the step shape never changes after
the first latent frame. The temporal upsamplers are the exception: on a
session's first latent frame they skip their time conv (diffusers marks it
"Rep") and leave their cache at zero, so the first latent frame decodes to one
output frame and every later one to ``temporal_upsample`` (4) frames.

API (the engine thread is the only caller; a session owns one state)::

    dec = StreamingWanDecoder(vae)                       # vae: AutoencoderKLWan, eval mode
    nbytes = dec.state_bytes(batch=1, latent_height=60, latent_width=104)   # capacity
    state = dec.new_state(1, 60, 104)                    # zeros, on the VAE's device
    for frame in dec.frames(state, z_block):             # z_block [B, z_dim, T, 60, 104]
        send(frame)                                      # [B, 3, 480, 832], in [-1, 1]
    video = dec.decode(state, z_next)                    # [B, 3, T_out, 480, 832]
    for rows, video in dec.frames_batch(states, z_rows): # sessions' one-row states, z_rows [R, ...]
        send(rows, video)                                # [len(rows), 3, t, 480, 832]
    videos = dec.decode_batch(states, z_rows)            # row r: [3, T_out, 480, 832]
    state.to_host(); state.to_device("cuda")             # swap, bit-exact
    state.reset()                                        # session reset: zeros again
    state.free()                                         # session close

``frames`` yields each output frame as soon as its latent frame is decoded, so
the first frame of a block is out after one latent frame's work, not the
block's. ``frames_batch`` does the same for the rows of many sessions, each
after its own state, all rows in one call per latent frame: every causal conv
copies each row's cache into the batch's conv input and its last frames back,
the copies one session alone makes, so a batch holds no stacked copy of the
states and needs no memory beyond its activations (kv capacity counts each
state once, as ``model_state_bytes``). ``rows_apart`` says when a row's kernels
still run alone (CPU: bit for bit). ``state.latent_frames`` counts the latent
frames decoded so far.
``cuda_graph=True`` replays the per-latent-frame step as a CUDA graph per state
(captured on the state's second steady step, dropped when the state moves);
``channels_last=True`` runs the convolutions channels-last with the spatial
padding inside the conv (faster on GPUs, equal only to dtype tolerance).
Measured on one H200 (bench/world/bench_wan_vae.py,
bench/results/wan_vae_decode_h200.json; default config, bf16, 480 x 832, blocks
of 3 latent frames, 3-21 latent frames): diffusers' one-shot decode 21.1 ms per
output frame; streaming eager 21.2 (bit-equal to it), with CUDA graphs 21.0
(the step is cuDNN-bound, launches are not the cost), channels-last 16.8 and
channels-last with graphs 16.6 (1.27x faster; max |diff| 0.05 in bf16). First
frame of a steady block after 66 ms of its 199 ms. The state is 1,801 MiB per
session at this geometry in bf16; a swap round trip (pinned) is 35 + 35 ms.

Only the Wan 2.1 layout is supported (``is_residual=False``, no ``patch_size``):
the LingBot-World and DreamZero VAE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: Past frames a 3-tap causal temporal conv keeps (diffusers' CACHE_T).
CACHE_FRAMES = 2


class WanDecodeState:
    """One session's decoder caches: one ``[B, C, 2, H, W]`` tensor per causal conv.

    Model-owned per-session state: ``nbytes`` is what capacity counts, ``to_host``
    / ``to_device`` swap it bit-exactly, ``free`` releases it on close.
    """

    def __init__(self, caches: list[torch.Tensor], batch: int, latent_hw: tuple[int, int]) -> None:
        self._caches: list[torch.Tensor] | None = caches
        self.batch = batch
        self.latent_hw = latent_hw
        self.latent_frames = 0
        self._graph: tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor] | None = None
        self._eager_steady_steps = 0

    @property
    def caches(self) -> list[torch.Tensor]:
        if self._caches is None:
            raise RuntimeError("the decode state was freed")
        return self._caches

    @property
    def nbytes(self) -> int:
        """Bytes the caches hold (0 once freed)."""
        if self._caches is None:
            return 0
        return sum(c.numel() * c.element_size() for c in self._caches)

    @property
    def device(self) -> torch.device:
        return self.caches[0].device

    @property
    def freed(self) -> bool:
        return self._caches is None

    def to_host(self, pin: bool | None = None) -> None:
        """Move the caches to host memory (pinned when they were on CUDA)."""
        caches = self.caches
        # Always fresh host buffers (also from CPU): the device copies are dropped.
        pin = caches[0].device.type == "cuda" if pin is None else pin
        host = []
        for c in caches:
            h = torch.empty_like(c, device="cpu", pin_memory=pin)  # keeps the memory format
            h.copy_(c, non_blocking=pin)
            host.append(h)
        if caches[0].device.type == "cuda":  # the copies above may still be in flight
            torch.cuda.current_stream(caches[0].device).synchronize()
        self._drop_graph()
        self._caches = host

    def to_device(self, device: torch.device | str) -> None:
        """Move the caches back onto ``device`` (same values, same memory format)."""
        device = torch.device(device)
        caches = self.caches
        if caches[0].device.type == device.type and device.index in (None, caches[0].device.index):
            return
        moved = []
        for c in caches:
            d = torch.empty_like(c, device=device)
            d.copy_(c, non_blocking=c.is_pinned())
            moved.append(d)
        self._drop_graph()
        self._caches = moved

    def reset(self) -> None:
        """Forget the past (session reset): zero caches, keep the memory."""
        for c in self.caches:
            c.zero_()
        self.latent_frames = 0

    def free(self) -> None:
        """Release the caches (session close); the state is unusable afterwards."""
        self._drop_graph()
        self._caches = None

    def _drop_graph(self) -> None:
        # A captured graph reads the caches' addresses: a moved state recaptures.
        self._graph = None
        self._eager_steady_steps = 0


class StreamingWanDecoder:
    """Stateful block-by-block decode with a ``diffusers.AutoencoderKLWan``'s weights."""

    def __init__(self, vae: nn.Module, *, cuda_graph: bool = False, channels_last: bool = False,
                 batch_invariant: bool | None = None) -> None:
        """``vae``: an ``AutoencoderKLWan`` (Wan 2.1 layout). ``channels_last`` converts its
        decoder weights to channels-last in place (same values; other users of the module see it).
        ``batch_invariant``: how a batch of sessions' rows runs its kernels (``rows_apart``)."""
        config = vae.config
        if getattr(config, "is_residual", False) or getattr(config, "patch_size", None) is not None:
            raise ValueError("streaming decode supports the Wan 2.1 VAE layout only (is_residual=False, no patch_size)")
        self.vae = vae
        self.cuda_graph = cuda_graph
        self.channels_last = channels_last
        self.batch_invariant = batch_invariant
        dec = vae.decoder
        self._upsamplers = [up.upsamplers[0] for up in dec.up_blocks if up.upsamplers is not None]
        #: Output frames per latent frame after a session's first (4 for Wan 2.1).
        self.temporal_upsample = 2 ** sum(r.mode == "upsample3d" for r in self._upsamplers)
        #: Pixels per latent pixel along height and width (8 for Wan 2.1).
        self.spatial_upsample = 2 ** len(self._upsamplers)
        self._pool = None
        if channels_last:
            for m in dec.modules():
                if isinstance(m, nn.Conv3d):
                    m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
                elif isinstance(m, nn.Conv2d):
                    m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)

    # -- sizes -------------------------------------------------------------------------

    def cache_shapes(self, batch: int, latent_height: int, latent_width: int) -> list[tuple[int, ...]]:
        """Shapes of the state's caches, in the decoder's order, without allocating."""
        dec = self.vae.decoder
        h, w = latent_height, latent_width
        shapes = []

        def conv(c: nn.Conv3d) -> None:
            if c.kernel_size[0] != 1 + CACHE_FRAMES:
                raise ValueError(f"unexpected temporal kernel {c.kernel_size}")
            shapes.append((batch, c.in_channels, CACHE_FRAMES, h, w))

        conv(dec.conv_in)
        for r in dec.mid_block.resnets:
            conv(r.conv1)
            conv(r.conv2)
        for up in dec.up_blocks:
            for r in up.resnets:
                conv(r.conv1)
                conv(r.conv2)
            if up.upsamplers is not None:
                if up.upsamplers[0].mode == "upsample3d":
                    conv(up.upsamplers[0].time_conv)
                h, w = 2 * h, 2 * w
        conv(dec.conv_out)
        return shapes

    def state_bytes(self, batch: int, latent_height: int, latent_width: int) -> int:
        """Bytes of one state at this geometry in the VAE's dtype (for capacity planning)."""
        itemsize = torch.empty((), dtype=self._dtype).element_size()
        return sum(itemsize * _numel(s) for s in self.cache_shapes(batch, latent_height, latent_width))

    def output_frames(self, latent_frames_before: int, latent_frames: int) -> int:
        """Output frames that ``latent_frames`` more latent frames decode to."""
        first = 1 if latent_frames_before == 0 and latent_frames > 0 else 0
        return first + self.temporal_upsample * (latent_frames - first)

    @property
    def _dtype(self) -> torch.dtype:
        return self.vae.decoder.conv_in.weight.dtype

    # -- state -------------------------------------------------------------------------

    def new_state(
        self, batch: int, latent_height: int, latent_width: int, device: torch.device | str | None = None
    ) -> WanDecodeState:
        """A fresh state (zeros: the decoder's past before the first frame)."""
        device = self.vae.decoder.conv_in.weight.device if device is None else torch.device(device)
        fmt = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        caches = [
            torch.zeros(s, dtype=self._dtype, device=device).contiguous(memory_format=fmt)
            for s in self.cache_shapes(batch, latent_height, latent_width)
        ]
        return WanDecodeState(caches, batch, (latent_height, latent_width))

    # -- decode ------------------------------------------------------------------------

    @torch.no_grad()
    def frames(self, state: WanDecodeState, z: torch.Tensor) -> Iterator[torch.Tensor]:
        """Decode ``z`` [B, z_dim, T, h, w] after the state's past; yield each output frame [B, C, H, W].

        The state advances one latent frame at a time as the generator is consumed;
        a generator left unfinished leaves the state after the last latent frame it
        decoded (``state.latent_frames``).
        """
        z_dim = self.vae.post_quant_conv.in_channels
        if (z.dim() != 5 or z.shape[0] != state.batch or z.shape[1] != z_dim
                or tuple(z.shape[3:]) != state.latent_hw):
            raise ValueError(f"latents {tuple(z.shape)} do not match the state (batch {state.batch}, "
                             f"{z_dim} channels, latent {state.latent_hw})")
        x = self.vae.post_quant_conv(z)
        for i in range(x.shape[2]):
            out = self._advance(state, x[:, :, i : i + 1])
            for j in range(out.shape[2]):
                yield out[:, :, j]

    @torch.no_grad()
    def decode(self, state: WanDecodeState, z: torch.Tensor) -> torch.Tensor:
        """Decode a whole block: ``[B, C, T_out, H, W]`` (see ``frames``)."""
        return torch.stack(list(self.frames(state, z)), dim=2)

    def frames_batch(self, states: Sequence[WanDecodeState],
                     z: torch.Tensor) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Decode row ``r`` of ``z`` [R, z_dim, T, h, w] after ``states[r]``'s past (each a
        one-row state of its own session), all rows in one call per latent frame; yield
        ``(rows, video [len(rows), C, t, H, W])`` as each latent frame is done.

        A session's first latent frame makes 1 frame and skips the upsamplers' time convs,
        every later one makes 4, so on that latent frame the rows at their first block run
        as one call and the others as another (first rows first); every other latent frame
        is one call for all rows. Each row equals its session decoded alone: bit for bit where
        its convolutions and attention run apart (``rows_apart``: CPU), to float rounding where
        all rows share them (CUDA; tests/models/world/test_batched_decode.py). Rows run eager
        (``cuda_graph`` is for one row). One row is ``frames`` itself, one frame per yield, bit
        for bit. Refuses (``ValueError``) before any state moves."""
        check_rows(states, z, self.vae.post_quant_conv.in_channels)
        if len(states) == 1:
            return (([0], f.unsqueeze(2)) for f in self.frames(states[0], z))
        return self._frames_batch(states, z)

    @torch.no_grad()
    def decode_batch(self, states: Sequence[WanDecodeState], z: torch.Tensor) -> list[torch.Tensor]:
        """Decode a whole block of every row (``frames_batch``): row ``r``'s ``[C, T_out, H, W]``.
        One row is ``decode`` itself."""
        if len(states) == 1:
            check_rows(states, z, self.vae.post_quant_conv.in_channels)
            return [self.decode(states[0], z)[0]]
        videos: list[list[torch.Tensor]] = [[] for _ in states]
        for rows, video in self.frames_batch(states, z):
            for k, r in enumerate(rows):
                videos[r].append(video[k])
        return [torch.cat(v, dim=1) for v in videos]

    @torch.no_grad()
    def _frames_batch(self, states: Sequence[WanDecodeState],
                      z: torch.Tensor) -> Iterator[tuple[list[int], torch.Tensor]]:
        apart = rows_apart(self.batch_invariant, z.device)
        x = by_row(self.vae.post_quant_conv, len(states) if apart else 1, z)
        for i in range(x.shape[2]):
            step = x[:, :, i : i + 1]
            first = [r for r, s in enumerate(states) if s.latent_frames == 0]
            later = [r for r, s in enumerate(states) if s.latent_frames > 0]
            for rows, is_first in ((first, True), (later, False)):
                if not rows:
                    continue
                xs = step if len(rows) == len(states) else step[rows]
                if len(rows) == 1:
                    caches: list = states[rows[0]].caches
                else:   # per conv, the rows' own cache tensors (``_conv_rows``)
                    caches = list(zip(*(states[r].caches for r in rows)))
                out = self._step(caches, xs, is_first, len(rows) if apart else 1)
                for r in rows:
                    states[r].latent_frames += 1
                yield rows, out

    def _advance(self, state: WanDecodeState, x: torch.Tensor) -> torch.Tensor:
        first = state.latent_frames == 0
        use_graph = self.cuda_graph and not first and x.device.type == "cuda"
        if first:
            out = self._step(state.caches, x, True)
        elif not use_graph:
            out = self._steady_step(state.caches, x)
        else:
            if state._graph is None and state._eager_steady_steps < 1:
                # One uncaptured steady step first: cuDNN picks its algorithms outside capture.
                out = self._steady_step(state.caches, x)
                state._eager_steady_steps += 1
            else:
                if state._graph is None:
                    state._graph = self._capture(state, x)
                graph, static_in, static_out = state._graph
                static_in.copy_(x)
                graph.replay()
                out = static_out.clone()
        state.latent_frames += 1
        return out

    def _capture(self, state: WanDecodeState, x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        # Capture records kernels without running them, so the state is untouched.
        # All states' graphs share one pool: they replay one at a time on this thread.
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        static_in = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self._steady_step(state.caches, static_in)
        return graph, static_in, static_out

    # -- one latent frame (mirrors diffusers' WanDecoder3d.forward op for op) -----------

    def _steady_step(self, caches: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self._step(caches, x, False)

    def _step(self, caches: list, x: torch.Tensor, first: bool, split: int = 1) -> torch.Tensor:
        # ``caches``: per causal conv a state's cache tensor, or a tuple of the rows' own
        # (``_conv_rows``); ``split``: the row groups whose kernels run apart (``by_row``).
        dec = self.vae.decoder
        it = iter(caches)
        x = self._conv(dec.conv_in, x, next(it), split)
        mid = dec.mid_block
        x = self._resnet(mid.resnets[0], x, it, split)
        for attn, resnet in zip(mid.attentions, mid.resnets[1:]):
            x = by_row(attn, split, x)
            x = self._resnet(resnet, x, it, split)
        for up in dec.up_blocks:
            for resnet in up.resnets:
                x = self._resnet(resnet, x, it, split)
            if up.upsamplers is not None:
                x = self._upsample(up.upsamplers[0], x, it, first, split)
        x = dec.nonlinearity(dec.norm_out(x))
        x = self._conv(dec.conv_out, x, next(it), split)
        return torch.clamp(x, min=-1.0, max=1.0)

    def _resnet(self, block: nn.Module, x: torch.Tensor, it: Iterator, split: int) -> torch.Tensor:
        h = by_row(block.conv_shortcut, split, x)
        x = block.nonlinearity(block.norm1(x))
        x = self._conv(block.conv1, x, next(it), split)
        x = block.nonlinearity(block.norm2(x))
        x = block.dropout(x)
        x = self._conv(block.conv2, x, next(it), split)
        return x + h

    def _upsample(self, r: nn.Module, x: torch.Tensor, it: Iterator, first: bool, split: int) -> torch.Tensor:
        b, c, t, h, w = x.size()
        if r.mode == "upsample3d":
            cache = next(it)
            if not first:  # the first frame skips the time conv, its cache stays zero
                x = self._conv(r.time_conv, x, cache, split)
                x = x.reshape(b, 2, c, t, h, w)
                x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]), 3)
                x = x.reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        x = by_row(r.resample, split, x)   # [b * t, ...]: row-major, t frames a row
        return x.view(b, t, x.size(1), x.size(2), x.size(3)).permute(0, 2, 1, 3, 4)

    def _conv(self, conv: nn.Conv3d, x: torch.Tensor, cache: torch.Tensor | tuple[torch.Tensor, ...],
              split: int = 1) -> torch.Tensor:
        if not isinstance(cache, torch.Tensor):
            return self._conv_rows(conv, x, cache, split)
        inp = torch.cat([cache, x], dim=2)
        cache.copy_(inp[:, :, -CACHE_FRAMES:])
        return self._conv_input(conv, inp)

    def _conv_rows(self, conv: nn.Conv3d, x: torch.Tensor, caches: tuple[torch.Tensor, ...],
                   split: int) -> torch.Tensor:
        # Row r's past is session r's own cache: it is copied into the conv input where
        # torch.cat puts it and the input's last frames back into it, the copies one row
        # makes alone. No stacked copy of the states exists, so a batch needs no memory
        # beyond its activations (capacity counts each state once, in model_state_bytes).
        b, c, t, h, w = x.shape
        fmt = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        inp = torch.empty((b, c, CACHE_FRAMES + t, h, w), dtype=x.dtype, device=x.device, memory_format=fmt)
        inp[:, :, CACHE_FRAMES:] = x
        for r, cache in enumerate(caches):
            inp[r : r + 1, :, :CACHE_FRAMES] = cache
            cache.copy_(inp[r : r + 1, :, -CACHE_FRAMES:])
        return by_row(lambda part: self._conv_input(conv, part), split, inp)

    def _conv_input(self, conv: nn.Conv3d, inp: torch.Tensor) -> torch.Tensor:
        pw, _, ph, _, _, _ = conv._padding  # (w, w, h, h, 2*t, 0): the time pad is the cache
        if self.channels_last:
            return F.conv3d(inp, conv.weight, conv.bias, conv.stride, (0, ph, pw), conv.dilation, conv.groups)
        # Explicit pad then an unpadded conv, as diffusers does, so float32 is bit-exact.
        return nn.Conv3d.forward(conv, F.pad(inp, (pw, pw, ph, ph, 0, 0)))


def rows_apart(batch_invariant: bool | None, device: torch.device) -> bool:
    """Whether a batch of sessions' rows runs each kernel whose rounding depends on the batch
    size (convolutions, attention) once per row: ``batch_invariant``, or where that is None,
    on CPU. There oneDNN picks a convolution by the batch size and rounds a row differently
    in a batch than alone (torch 2.13), and a session's frames are bit for bit whatever shares
    its batches (``models/world/base.py``); so a row is alone in every such call, the rest of
    the work (states, norms, activations, the frames out) stays batched. On CUDA all rows run
    in one call, each equal to the row alone to rounding (the same contract's CUDA clause)."""
    return device.type == "cpu" if batch_invariant is None else batch_invariant


def by_row(fn: Callable[..., torch.Tensor], split: int, *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)``, or with ``split`` > 1 one call per row group (``xs`` split evenly along their
    first dimension, row-major) concatenated: each group's result as that group alone gives it."""
    if split == 1:
        return fn(*xs)
    return torch.cat([fn(*parts) for parts in zip(*(x.chunk(split) for x in xs))])


def check_rows(states: Sequence[WanDecodeState], z: torch.Tensor, channels: int) -> None:
    """Refuse (``ValueError``) a batch of sessions' rows that does not match its states: one
    distinct one-row state per row of ``z`` [R, channels, T >= 1, h, w], all at ``z``'s latent
    size and on one device. Nothing has moved when it refuses."""
    if not states:
        raise ValueError("no rows to decode")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("a decode state appears twice in one batch")
    if any(s.batch != 1 for s in states):
        raise ValueError(f"batched decode takes one-row states, got batches {[s.batch for s in states]}")
    hw = {s.latent_hw for s in states}
    if (len(hw) != 1 or z.dim() != 5 or z.shape[0] != len(states) or z.shape[1] != channels or z.shape[2] < 1
            or tuple(z.shape[3:]) != states[0].latent_hw):
        raise ValueError(f"latents {tuple(z.shape)} do not match the states ({len(states)} rows, {channels} "
                         f"channels, 1 or more frames, latent {sorted(hw)})")
    if len({s.device for s in states}) != 1:
        raise ValueError(f"decode states on several devices: {sorted({str(s.device) for s in states})}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n

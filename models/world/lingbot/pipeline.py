"""Sessions of the LingBot-World v2 pipeline: prompt, first image, camera, one block per tick.

Per block of ``num_frames_per_block`` latent frames and each row (session)::

    x = noise(seed, 4 * block + 0)
    for i, t in enumerate(DMD_TIMESTEPS[:steps]):         # (1000, 750, 500, 250): 4 steps, no CFG
        s = shift(t / 1000)                               # flow shift 5.0 from the scheduler config
        flow = transformer([x, cond], s * 1000, camera)   # transient: no cache byte changes
        x0 = x - s * flow                                 # flow prediction: x_s = (1-s) x0 + s eps
        x = (1 - s') x0 + s' * noise(seed, 4 * block + i + 1)   # s' = the next step's sigma
    transformer([x0, cond], 0, camera, update_cache=True) # the committing pass keeps the block's K/V
    frames = decoder.frames_batch(states, x0)             # uint8, 9 frames then 12 per block, all
                                                          # rows in one call, each frame to the
                                                          # request's on_frame as it exists

That is the exact path (``steps=4``, ``reuse_kv=False``, the Wan VAE). Two shortcuts change
it (``options.py``; the bench measures each one's deviation from it):

* ``steps`` < 4 runs the first ``steps`` timesteps (``denoising_timesteps``) and keeps the
  last one's ``x0``. The noise counters do not move (draw ``i`` of block ``b`` is still
  ``4b + i``), so a block's first ``steps`` passes are the exact path's, bit for bit.
* ``reuse_kv`` makes the last denoising pass the committing one (``update_cache=True``):
  the block's K/V written are those of its last noisy input at that step's timestep, not
  of ``x0`` at t = 0, and the committing pass is skipped (``steps`` passes per block, not
  ``steps + 1``). The K/V go into the same scratch pages and commit the same way.

The prompt is encoded (UMT5, zero-padded to 512 tokens) and projected to every
layer's text K/V once, when the session opens, and again only when a block asks
for a different prompt. A failed block aborts its kv chunk and leaves the
session's camera and latents as they were.

Noise: ``noise(seed, n)`` is ``models.world.noise.normal`` of the session's seed at
counter ``n`` (the block's index in the session, times the draws per block, plus the
draw): a function of the seed and the position only, so a reset, a session swapped
out and back, or one dropped and opened again replays its blocks, and the other
rows of a batch change none of it.

Decoding is streaming (``models/world/wan_vae.py``; ``decoders.py`` for the TAEHV choice,
whose state works alike): each session owns a Wan VAE
decode state (the causal convs' past frames), so the video decoded block by block
equals a one-shot decode of all the session's latents. The state is model-owned
kv state: ``model_state_bytes`` in the kv geometry (capacity counts it), attached
to the session in ``Residency`` (swapped to host and back with the session's KV
when the pool needs room, freed on close), zeroed on reset. The decode advances
the state in place and cannot be rewound, so a block that is aborted after it was
decoded (or fails while decoding) closes the session's world: its next tick must
start again at chunk 0. The session code fails and releases a session whose
tick was not committed anyway, so nothing is lost that a client could continue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from models.world.block_world import BlockPipeline, NoCapacity
from models.world.lingbot.attention import BlockKV, write_text
from models.world.lingbot.cache import TEXT_TOKENS, kv_geometry, make_cache
from models.world.lingbot.camera import CameraState, advance
from models.world.lingbot.checkpoint import Components, load_components
from models.world.lingbot.config import VAE_SPATIAL_STRIDE
from models.world.lingbot.decoders import BlockDecoder, wan_decoder
from models.world.lingbot.vae_io import condition_at, image_condition
from models.world.noise import int64_bits, normal
from models.world.parallel.ulysses import Ulysses, per_rank_geometry
from models.world.wan_vae import WanDecodeState

log = logging.getLogger(__name__)

DMD_TIMESTEPS = (1000.0, 750.0, 500.0, 250.0)
# Noise draws per block: the first noise and one per later step of the full schedule. Fixed
# whatever ``steps`` is, so fewer steps draw the same noise as the exact path's first ones.
NOISE_DRAWS = len(DMD_TIMESTEPS)
DEFAULT_SIZE = (480, 832)
# Latent frames of the first-image condition encoded per session (117 video frames, as
# the reference bounds it); later frames reuse its last latent.
CONDITION_LATENTS = 30
# Host memory for sessions swapped out of the device pool (KV and decode state).
HOST_BUDGET_BYTES = 64 << 30


__all__ = ["CONDITION_LATENTS", "DEFAULT_SIZE", "DMD_TIMESTEPS", "HOST_BUDGET_BYTES", "NOISE_DRAWS", "BlockRequest",
           "LingBotPipeline", "NoCapacity", "SessionState", "denoising_timesteps", "shifted_sigma"]


def denoising_timesteps(steps: int) -> tuple[float, ...]:
    """The timesteps of a ``steps``-pass block: the first ``steps`` of ``DMD_TIMESTEPS``.

    A prefix, as FlashDreams' 1-step LingBot preset is the 4-step schedule's first
    (t, sigma) (NVIDIA/flashdreams#434): every pass then sees the (input, timestep) pairs
    the distilled model was trained on, and the block ends with that pass's ``x0``
    prediction. Refuses a count outside 1..4."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= len(DMD_TIMESTEPS):
        raise ValueError(f"steps must be an integer in 1..{len(DMD_TIMESTEPS)}, got {steps!r}")
    return DMD_TIMESTEPS[:steps]


def shifted_sigma(t: float, shift: float) -> float:
    """Flow-matching time shift: ``shift * s / (1 + (shift - 1) * s)`` with ``s = t / 1000``."""
    s = t / 1000.0
    return shift * s / (1.0 + (shift - 1.0) * s)


@dataclass(frozen=True)
class SessionState:
    """What one session carries between blocks (replaced, never mutated, on commit)."""

    prompt: str
    condition: torch.Tensor = field(repr=False)            # [4 + z, latents, h, w]
    camera: CameraState = CameraState()
    seed: int = 0                                          # the noise of every block (int64 bits)
    blocks: int = 0
    text_builds: int = 0                                   # times the text K/V were (re)built


@dataclass(frozen=True)
class BlockRequest:
    """One session's next block: its prompt and camera control."""

    session_id: str
    prompt: str | None = None
    keys: Sequence[Iterable[str]] = ()
    trajectory: tuple[torch.Tensor, torch.Tensor, bool] | None = None
    # Called with (frame index, uint8 [1, H, W, 3]) as each frame of the block is decoded.
    on_frame: Callable[[int, np.ndarray], None] | None = field(default=None, compare=False)


class LingBotPipeline(BlockPipeline[SessionState, SessionState]):
    """The model's parts and a kv pool; sessions keyed by id (``BlockPipeline``). One owner
    thread calls it."""

    name = "lingbot"

    def __init__(self, components: Components, *, height: int = DEFAULT_SIZE[0],
                 width: int = DEFAULT_SIZE[1], max_sessions: int = 1,
                 device: torch.device | str = "cpu", kv_dtype: torch.dtype | None = None,
                 text_tokens: int = TEXT_TOKENS, condition_latents: int = CONDITION_LATENTS,
                 host_budget_bytes: int = HOST_BUDGET_BYTES, steps: int = len(DMD_TIMESTEPS),
                 reuse_kv: bool = False, decoder: BlockDecoder | None = None,
                 sequence_parallel: Ulysses | None = None) -> None:
        step = VAE_SPATIAL_STRIDE * components.transformer.config.patch_size[1]
        if height % step or width % step:
            raise ValueError(f"height and width must be multiples of {step}, got {height}x{width}")
        self.parts = components
        self.model = components.transformer
        self.cfg = self.model.config
        self.height, self.width = height, width
        self.latent_hw = (height // VAE_SPATIAL_STRIDE, width // VAE_SPATIAL_STRIDE)
        self.device = torch.device(device)
        self.dtype = self.model.patch_embedding.weight.dtype
        self.text_tokens = text_tokens
        self.condition_latents = condition_latents
        self.flow_shift = float(components.scheduler.config.flow_shift)
        self.sigmas = [shifted_sigma(t, self.flow_shift) for t in denoising_timesteps(steps)]
        self.reuse_kv = reuse_kv
        self.block_decoder = decoder or wan_decoder(components.vae)
        self.decoder = self.block_decoder.streaming
        self.geometry = kv_geometry(self.cfg, *self.latent_hw, text_tokens=text_tokens,
                                    dtype=kv_dtype or self.dtype,
                                    model_state_bytes=self.decoder.state_bytes(1, *self.latent_hw))
        # Sequence parallel: this rank's pool holds its heads' share of every session's K/V.
        self.sequence_parallel = sequence_parallel
        self.model.sequence_parallel = sequence_parallel
        if sequence_parallel is not None:
            self.geometry = per_rank_geometry(self.geometry, sequence_parallel.size)
        super().__init__(make_cache(self.geometry, max_sessions, self.device), host_budget_bytes)
        # run() returns each block's frames as a uint8 tensor on the device instead of numpy:
        # the world base then copies a batch to the host at once, and the server may encode
        # jpeg there first (realtime/media.py, DeviceJpeg). The adapter turns it on for CUDA.
        self.device_frames = False

    @classmethod
    def from_checkpoint(cls, root: str | Path, *, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32, **kwargs) -> "LingBotPipeline":
        return cls(load_components(root, device, dtype), device=device, **kwargs)

    # -- text ----------------------------------------------------------------------------

    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """UMT5 states ``[1, text_tokens, text_dim]``, zero past the prompt's own tokens."""
        tok = self.parts.tokenizer(prompt, padding="max_length", max_length=self.text_tokens,
                                   truncation=True, add_special_tokens=True, return_tensors="pt")
        ids, mask = tok.input_ids.to(self.device), tok.attention_mask.to(self.device)
        states = self.parts.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return states * mask[..., None].to(states.dtype)

    def _build_text(self, session_id: str, prompt: str) -> None:
        text_kv = self.model.project_text(self.encode_prompt(prompt))
        sp = self.sequence_parallel
        if sp is not None:   # this rank's heads of the text K/V
            text_kv = [(sp.own_heads(k), sp.own_heads(v)) for k, v in text_kv]
        write_text(self.cache, session_id, [(k[0], v[0]) for k, v in text_kv])
        log.debug("lingbot session=%s text K/V built", session_id)

    # -- sessions ----------------------------------------------------------------------------

    @torch.no_grad()
    def open(self, session_id: str, prompt: str, image: np.ndarray | None = None, seed: int = 0) -> None:
        """Start a session: encode its prompt (once) and its first image, if any."""
        self._open_slot(session_id)
        try:
            self.residency.attach_state(session_id, self.decoder.new_state(1, *self.latent_hw, self.device))
            self._build_text(session_id, prompt)
            cond = image_condition(self.parts.vae, image, self.height, self.width,
                                   self.condition_latents, self.device)
        except BaseException:
            self.residency.close(session_id)
            raise
        self.sessions[session_id] = SessionState(prompt=prompt, condition=cond, seed=int64_bits(seed),
                                                 text_builds=1)
        log.info("lingbot session=%s opened (%s)", session_id, "image" if image is not None else "text only")

    def _restarted(self, session: SessionState, seed: int) -> SessionState:
        """Back to the first frame with the same prompt and image (text K/V kept)."""
        return replace(session, camera=CameraState(), blocks=0, seed=seed)

    def _decode_state(self, session_id: str) -> WanDecodeState:
        state = self.residency.state(session_id)
        assert isinstance(state, WanDecodeState)   # the Wan VAE's and TAEHV's state alike
        return state

    @property
    def passes_per_block(self) -> int:
        """Transformer forwards per block: the denoising passes, and the committing one unless
        the last denoising pass commits (``reuse_kv``)."""
        return len(self.sigmas) + (0 if self.reuse_kv else 1)

    # -- one block ------------------------------------------------------------------------------

    def _prepare(self, requests: Sequence[BlockRequest]) -> None:
        """A changed prompt is rebuilt before the block (the block uses the new text)."""
        for r in requests:
            s = self.sessions[r.session_id]
            if r.prompt is not None and r.prompt != s.prompt:
                self._build_text(r.session_id, r.prompt)
                self.sessions[r.session_id] = replace(s, prompt=r.prompt, text_builds=s.text_builds + 1)

    def _block(self, requests, batch, decoded: list[str]):
        F, (h, w) = self.cfg.num_frames_per_block, self.latent_hw
        states = [self.sessions[r.session_id] for r in requests]
        kv = BlockKV(self.cache, batch)
        starts = batch.start_frames
        cams, conds, cam_states = [], [], []
        for r, s, start in zip(requests, states, starts):
            keys = list(r.keys) if r.keys else [()] * F
            if len(keys) != F:
                raise ValueError(f"session {r.session_id}: {len(keys)} key sets for a block of {F}")
            cam, cs = advance(s.camera, keys, r.trajectory, self.height, self.width)
            cams.append(cam)
            cam_states.append(cs)
            conds.append(condition_at(s.condition, start, F))
        dev, dt = self.device, self.dtype
        camera = torch.stack(cams).to(dev, dt)
        cond = torch.stack(conds).to(dev, dt)
        z = self.cfg.out_channels
        # Each row's noise from its own (seed, position): draw ``i`` of block ``blocks`` is
        # counter ``blocks * NOISE_DRAWS + i`` (the first noise, then one per step after the first).
        seeds = torch.tensor([s.seed for s in states], dtype=torch.int64, device=dev)
        first = torch.tensor([s.blocks * NOISE_DRAWS for s in states], dtype=torch.int64, device=dev)

        def noise(i: int) -> torch.Tensor:
            return normal(seeds, first + i, (z, F, h, w))

        x0 = self._denoise(noise, cond, camera, kv, len(requests))
        # All rows in one decode; frame by frame when a row streams (on_frame), so the first
        # frames are out after one latent frame's decode.
        frames = self._decode(requests, self.block_decoder.prepare(x0.float()), decoded)
        pending = {r.session_id: replace(s, camera=cs, blocks=s.blocks + 1)
                   for r, s, cs in zip(requests, states, cam_states)}
        return frames, pending

    def _denoise(self, noise: Callable[[int], torch.Tensor], cond: torch.Tensor, camera: torch.Tensor,
                 kv: BlockKV, rows: int) -> torch.Tensor:
        """The block's denoising passes and its committing pass: the clean latents ``[R, z, F, h, w]``
        in the model's dtype, the block's K/V in its scratch pages."""
        dev, dt = self.device, self.dtype
        x = noise(0).to(dt)
        x0 = x
        last = len(self.sigmas) - 1
        for i, sigma in enumerate(self.sigmas):
            t = torch.full((rows,), sigma * 1000.0, device=dev)
            commit = self.reuse_kv and i == last
            flow = self.model(torch.cat([x, cond], 1), t, kv, camera, update_cache=commit)
            x0 = x.float() - sigma * flow
            if i < last:
                nxt = self.sigmas[i + 1]
                x = ((1 - nxt) * x0 + nxt * noise(i + 1)).to(dt)
        x0 = x0.to(dt)
        if not self.reuse_kv:
            self.model(torch.cat([x0, cond], 1), torch.zeros(rows, device=dev), kv, camera, update_cache=True)
        return x0

"""Sessions of Matrix-Game 2.0 on kv/: a first image, keyboard and mouse, one block per tick.

Per block (3 latent frames) of every row (session), all rows in one forward per pass::

    x = noise(seed, draws * block + 0)
    for i, t in enumerate(warped steps):                 # 1000, 666, 333 (templerun: 4 steps)
        x0 = x - sigma(t) * flow(x, t)                   # K/V written to the chunk's scratch pages
        x = (1 - sigma') x0 + sigma' * noise(seed, draws * block + i + 1)
    flow(x0, t = 0)                                      # the committing pass: its K/V and action
                                                         # caches are what the session keeps
    frames = decoder.frames_batch(states, x0)            # 9 frames for the first block, 12 after;
                                                         # every row in one call per latent frame

(``denoise.py`` holds the schedule; ``attention.py`` how a pass attends.) Noise is
``models.world.noise.normal`` of the session's seed at a counter of the block and the draw
only, so a reset, a swap to the host and back, or the company of other sessions replays it.

Condition: the first image (the session's, else a maze frame rendered from its seed, see
``default_image``) is encoded by the Wan VAE followed by blank frames, as upstream does, with
the 4-channel mask set on latent frame 0. Upstream encodes the whole video's length; the
encoder is causal and sees only blank frames after the first few latents, so their latents
repeat exactly, and the condition is encoded for ``CONDITION_LATENTS`` latent frames and its
last one reused beyond (``condition_at``). The CLIP vision tower encodes the same image; its
tokens are projected to every layer's cross K/V once and kept in the session's kv cross slot.

Actions: one keyboard vector and one mouse vector per video frame. The block's windows read
the 12 video frames before each latent frame (``window.py``), so a session keeps the last
``WINDOW`` video frames of its actions (``Session.keyboard``/``mouse``) and the block's own.

Session state that is not kv pages is model-owned kv state (``cache.SessionState``): the
streaming decoder's caches and the action K/V caches, swapped and freed with the session.
A failed block aborts its kv chunk and leaves the rest as it was, except that a block
decoded before it failed has moved the decoder on: that session's world is closed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from kv import KVGeometry
from models.world.block_world import BlockPipeline, NoCapacity
from models.world.matrix_game.attention import PagedBlock
from models.world.matrix_game.cache import ActionCache, SessionState, kv_geometry, make_cache
from models.world.matrix_game.config import (FRAMES_PER_BLOCK, MASK_CHANNELS, VAE_SPATIAL_STRIDE,
                                             VAE_TEMPORAL_STRIDE, Variant)
from models.world.matrix_game.denoise import denoise
from models.world.matrix_game.model import MatrixGameDiT
from models.world.matrix_game.window import windows_from
from models.world.noise import int64_bits, normal
from models.world.wan_vae import StreamingWanDecoder

log = logging.getLogger(__name__)

DEFAULT_SIZE = (352, 640)
CONDITION_LATENTS = 6
HOST_BUDGET_BYTES = 32 << 30
# Video frames of actions a session keeps between blocks: a window's length (the next block's
# first window starts 12 frames before its first latent frame, 9 before its first video frame).
WINDOW = 12


__all__ = ["CONDITION_LATENTS", "DEFAULT_SIZE", "HOST_BUDGET_BYTES", "WINDOW", "BlockRequest", "MatrixGamePipeline",
           "NoCapacity", "Session", "condition_at", "default_image", "session_geometry"]


def session_geometry(dit: MatrixGameDiT, vae: Any, clip: Any, height: int, width: int,
                     decoder: Any | None = None) -> KVGeometry:
    """The kv geometry of sessions at ``height`` x ``width``: the DiT's pages, the CLIP tokens
    in the cross slot, the decoder state (``decoder``, None: the Wan VAE's) and action caches
    as model state (capacity counts them)."""
    lh, lw = height // VAE_SPATIAL_STRIDE, width // VAE_SPATIAL_STRIDE
    dtype = dit.patch_embedding.weight.dtype
    actions = ActionCache(dit.config, dit.tokens_per_frame(lh, lw))
    state = (decoder or StreamingWanDecoder(vae)).state_bytes(1, lh, lw) + actions.nbytes(dtype)
    return kv_geometry(dit.config, lh, lw, clip.model.visual.pos_embedding.shape[1], dtype=dtype,
                       model_state_bytes=state)


def default_image(seed: int, height: int, width: int) -> np.ndarray:
    """A first image when the client sends none: a first-person maze view of the session's seed."""
    from models.maze.sim import MazeSim

    return MazeSim([seed & 0x7FFFFFFF], height=height, width=width).render()[0].cpu().numpy()


@dataclass(frozen=True)
class Session:
    """What one session carries between blocks (replaced, never mutated, on commit)."""

    condition: torch.Tensor = field(repr=False)     # [4 + 16, CONDITION_LATENTS, h, w]
    seed: int = 0
    blocks: int = 0
    video_frames: int = 0                           # video frames made so far
    keyboard: torch.Tensor | None = field(default=None, repr=False)   # [<= WINDOW, keys], the last frames'
    mouse: torch.Tensor | None = field(default=None, repr=False)      # [<= WINDOW, 2] (pitch, yaw)


@dataclass(frozen=True)
class BlockRequest:
    """One session's next block: its actions, one per video frame of the block (9 for the
    first block, 12 after): ``keyboard [T, keys]``, ``mouse [T, 2]`` (pitch, yaw; None for a
    model without a mouse)."""

    session_id: str
    keyboard: torch.Tensor
    mouse: torch.Tensor | None = None
    # Called with (frame index in the block, uint8 [1, H, W, 3]) as each frame is decoded.
    on_frame: Callable[[int, np.ndarray], None] | None = field(default=None, compare=False)


class MatrixGamePipeline(BlockPipeline[Session, tuple[Session, list[torch.Tensor]]]):
    """The model's parts and a kv pool; sessions keyed by id (``BlockPipeline``). One owner
    thread calls it."""

    name = "matrix-game"

    def __init__(self, dit: MatrixGameDiT, variant: Variant, vae: Any, clip: Any, *,
                 height: int = DEFAULT_SIZE[0], width: int = DEFAULT_SIZE[1], max_sessions: int = 1,
                 device: torch.device | str = "cpu", host_budget_bytes: int = HOST_BUDGET_BYTES,
                 condition_latents: int = CONDITION_LATENTS, taehv: Any | None = None) -> None:
        cfg = dit.config
        step = VAE_SPATIAL_STRIDE * cfg.patch_size[1]
        if height % step or width % step:
            raise ValueError(f"height and width must be multiples of {step}, got {height}x{width}")
        self.model, self.cfg, self.variant = dit, cfg, variant
        self.vae, self.clip = vae, clip
        self.height, self.width = height, width
        self.latent_hw = (height // VAE_SPATIAL_STRIDE, width // VAE_SPATIAL_STRIDE)
        self.device = torch.device(device)
        self.dtype = dit.patch_embedding.weight.dtype
        self.condition_latents = condition_latents
        # The Wan VAE decodes de-normalised latents; TAEHV (``models/world/taehv.py``, opt-in)
        # the diffusion latents as they are. Both stream with one state per session.
        self.decoder = taehv if taehv is not None else StreamingWanDecoder(vae)
        self.decoder_name = "wan" if taehv is None else "taehv"
        self.tokens_per_frame = dit.tokens_per_frame(*self.latent_hw)
        self.actions = ActionCache(cfg, self.tokens_per_frame)
        self.geometry = session_geometry(dit, vae, clip, height, width, taehv)
        super().__init__(make_cache(self.geometry, max_sessions, self.device), host_budget_bytes)
        self._admitted: set[str] = set()   # admitted at create, not opened by a block yet

    @property
    def passes_per_block(self) -> int:
        return len(self.variant.steps) + 1

    # -- sessions ------------------------------------------------------------------------------

    def admit(self, session_id: str) -> str | None:
        """Count a new session against kv before its first block opens it: None when it fits
        beside every open and admitted session, each counted at its most (``Residency.refusal``:
        resident slots, then the host budget), else why not. A refusal changes nothing; an
        admitted session is never dropped to make room for a later one. ``open`` or ``close``
        ends the admission."""
        if session_id in self.sessions or session_id in self._admitted:
            return None
        refusal = self.residency.refusal(pending=len(self._admitted))
        if refusal is None:
            self._admitted.add(session_id)
        return refusal

    @torch.no_grad()
    def open(self, session_id: str, image: np.ndarray | None = None, seed: int = 0) -> None:
        """Start a session from its first image (None: ``default_image`` of its seed)."""
        if image is None:
            image = default_image(seed, self.height, self.width)
        if image.shape != (self.height, self.width, 3) or image.dtype != np.uint8:
            raise ValueError(f"image must be uint8 [{self.height}, {self.width}, 3], got {image.dtype} {image.shape}")
        self._open_slot(session_id)
        try:
            decode = self.decoder.new_state(1, *self.latent_hw, self.device)
            self.residency.attach_state(session_id, SessionState(decode, self.actions.new(self.device, self.dtype)))
            pixels = torch.from_numpy(image).to(self.device).permute(2, 0, 1).float() / 127.5 - 1.0   # [3, H, W]
            tokens = self.clip.encode(pixels[None])[0]
            for layer, (k, v) in enumerate(self.model.project_image(tokens)):
                self.cache.write_cross(session_id, layer, k, v)
            cond = self._condition(pixels)
        except BaseException:
            self.residency.close(session_id)
            raise
        self.sessions[session_id] = Session(condition=cond, seed=int64_bits(seed))
        self._admitted.discard(session_id)
        log.info("matrix-game session=%s opened", session_id)

    def _condition(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[4 + 16, latents, h, w]``: the mask (1 on latent 0), then the VAE latents of the image
        followed by blank frames, normalised as upstream (``(mu - mean) / std``)."""
        frames = 1 + VAE_TEMPORAL_STRIDE * (self.condition_latents - 1)
        video = torch.zeros(1, 3, frames, self.height, self.width, device=self.device)
        video[0, :, 0] = pixels
        dtype = next(self.vae.parameters()).dtype
        z = self.vae.encode(video.to(dtype)).latent_dist.mode().float()[0]
        mean, std = self._stats(z)
        z = (z - mean[0]) / std[0]
        mask = torch.zeros(MASK_CHANNELS, *z.shape[1:], device=z.device)
        mask[:, 0] = 1.0
        return torch.cat([mask, z])

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        c = self.vae.config
        return (torch.tensor(c.latents_mean, dtype=like.dtype, device=like.device).view(shape),
                torch.tensor(c.latents_std, dtype=like.dtype, device=like.device).view(shape))

    def _decoder_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.decoder_name == "taehv":
            return x.to(self.decoder.dtype)
        mean, std = self._stats(x)
        return (x * std + mean).to(next(self.vae.parameters()).dtype)

    def _restarted(self, session: Session, seed: int) -> Session:
        """Back to the first frame with the same image (CLIP K/V kept)."""
        return Session(condition=session.condition, seed=seed)

    def close(self, session_id: str) -> None:
        super().close(session_id)
        self._admitted.discard(session_id)

    def _state(self, session_id: str) -> SessionState:
        state = self.residency.state(session_id)
        assert isinstance(state, SessionState)
        return state

    def _decode_state(self, session_id: str) -> Any:
        return self._state(session_id).decode

    # -- one block -----------------------------------------------------------------------------

    def frames_in_block(self, session_id: str) -> int:
        """Video frames the session's next block makes (and takes actions for): 9, then 12."""
        return self.decoder.output_frames(self.sessions[session_id].blocks * FRAMES_PER_BLOCK, FRAMES_PER_BLOCK)

    def _commit(self, session_id: str, pending: tuple[Session, list[torch.Tensor]]) -> None:
        session, actions = pending
        for dst, src in zip(self._state(session_id).actions.tensors, actions):
            dst.copy_(src)
        self.sessions[session_id] = session

    def _actions(self, s: Session, r: BlockRequest, start: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                          torch.Tensor, torch.Tensor | None]:
        """The block's action windows (keyboard, mouse) and the tails the session keeps."""
        a = self.cfg.action
        T = self.frames_in_block(r.session_id)
        if tuple(r.keyboard.shape) != (T, a.keyboard_dim_in):
            raise ValueError(f"session {r.session_id}: keyboard must be [{T}, {a.keyboard_dim_in}], "
                             f"got {list(r.keyboard.shape)}")
        if a.enable_mouse and (r.mouse is None or tuple(r.mouse.shape) != (T, a.mouse_dim_in)):
            raise ValueError(f"session {r.session_id}: mouse must be [{T}, {a.mouse_dim_in}], "
                             f"got {None if r.mouse is None else list(r.mouse.shape)}")
        wvf, stride = a.window_video_frames, a.vae_time_compression_ratio
        kb = r.keyboard.float().cpu()
        past = s.keyboard if s.keyboard is not None else kb[:0]
        history = torch.cat([past, kb])
        first = s.video_frames - len(past)
        k_win = windows_from(history, first, start, FRAMES_PER_BLOCK, wvf, stride)
        m_win = m_tail = None
        if a.enable_mouse:
            ms = r.mouse.float().cpu()
            m_hist = torch.cat([s.mouse if s.mouse is not None else ms[:0], ms])
            m_win = windows_from(m_hist, first, start, FRAMES_PER_BLOCK, wvf, stride)
            m_tail = m_hist[-WINDOW:]
        return k_win, m_win, history[-WINDOW:], m_tail

    def _block(self, requests: Sequence[BlockRequest], batch, decoded: list[str]):
        cfg, (h, w) = self.cfg, self.latent_hw
        dev, dt = self.device, self.dtype
        states = [self.sessions[r.session_id] for r in requests]
        starts = batch.start_frames
        kbs, mss, tails, conds = [], [], [], []
        for r, s, start in zip(requests, states, starts):
            if start != s.blocks * FRAMES_PER_BLOCK:
                raise RuntimeError(f"session {r.session_id}: kv at frame {start}, {s.blocks} blocks made")
            k_win, m_win, k_tail, m_tail = self._actions(s, r, start)
            kbs.append(k_win)
            mss.append(m_win)
            tails.append((k_tail, m_tail))
            conds.append(condition_at(s.condition, start, FRAMES_PER_BLOCK))
        keyboard = torch.stack(kbs).to(dev, dt)
        mouse = torch.stack(mss).to(dev, dt) if cfg.action.enable_mouse else None
        cond = torch.stack(conds).to(dev, dt)
        res = [self._state(r.session_id) for r in requests]
        draws = len(self.variant.steps)
        seeds = torch.tensor([s.seed for s in states], dtype=torch.int64, device=dev)
        first = torch.tensor([s.blocks * draws for s in states], dtype=torch.int64, device=dev)
        R = len(requests)
        kept: list[PagedBlock] = []

        def noise(i: int) -> torch.Tensor:
            return normal(seeds, first + i, (cfg.out_dim, FRAMES_PER_BLOCK, h, w))

        def flow(x: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
            attn = PagedBlock(cfg, self.cache, batch, res, self.actions, commit=commit)
            if commit:
                kept.append(attn)
            return self.model.flow(x, cond, t, starts, keyboard, mouse, attn)

        x0 = denoise(flow, noise, R, self.variant.steps)
        actions = kept[0].keep()
        frames = self._decode(requests, self._decoder_input(x0), decoded)   # all rows in one call
        pending = {}
        for row, (r, s, block) in enumerate(zip(requests, states, frames)):
            k_tail, m_tail = tails[row]
            pending[r.session_id] = (replace(s, blocks=s.blocks + 1, video_frames=s.video_frames + len(block),
                                             keyboard=k_tail, mouse=m_tail), actions[row])
        return frames, pending


def condition_at(cond: torch.Tensor, start: int, frames: int) -> torch.Tensor:
    """Latent frames ``start .. start+frames`` of a condition (the last one repeats past its end)."""
    idx = torch.clamp(torch.arange(start, start + frames, device=cond.device), max=cond.shape[1] - 1)
    return cond.index_select(1, idx)

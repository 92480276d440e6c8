"""What a model declares about its attention cache: ``KVGeometry``.

Units used throughout ``kv/``:

* a *token* is one key (or value) vector per KV head;
* a *frame* is ``tokens_per_frame`` tokens (one latent frame of a world model);
* a *block* (also *page*) is ``block_size`` consecutive tokens of one pool slot.
  ``block_size`` must divide ``tokens_per_frame``, so a frame always occupies
  ``pages_per_frame`` whole blocks and frames never share a block: releasing a
  frame releases whole blocks;
* a *tick* writes ``frames_per_tick`` frames, its *chunk* (LingBot calls this
  ``num_frame_per_block``; the capacity formula in the issue calls it
  ``frames_per_block``);
* retention releases frames in whole *spans* of ``span_frames`` frames (see
  ``retention``); a tick's chunk is whole spans.

``page_bytes`` is the size of one block across all layers, K and V together:
``num_layers * 2 * block_size * kv_heads * head_dim * itemsize``. Capacity is
counted in these all-layer pages (see ``capacity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class KVGeometry:
    """Attention-cache geometry of one model (all layers share it)."""

    num_layers: int
    kv_heads: int
    head_dim: int
    tokens_per_frame: int
    block_size: int
    sink_frames: int
    window_frames: int
    frames_per_tick: int = 1
    span_frames: int = 1
    dtype: torch.dtype = torch.bfloat16
    # Logical branches per session (one block table each), e.g. ("main",) or
    # ("positive", "negative") for classifier-free guidance.
    branches: tuple[str, ...] = ("main",)
    # Fixed-length cross-attention cache per branch (e.g. 512 text tokens); 0 = none.
    cross_tokens: int = 0
    # Capacity-only declarations: worker scratch blocks per branch beyond one
    # tick's frames, and bytes of state the model keeps per session itself.
    scratch_blocks: int = 0
    model_state_bytes: int = 0
    # True when the branches run one after another through one worker-local slot
    # (CFG positive pass, then negative), so the worker scratch is counted once.
    branches_share_worker_slot: bool = False
    # False when the model keeps no K/V of its own outside sessions' chunks (DreamZero: its
    # denoising passes' K/V are activations of one layer at a time), so no worker slot is
    # reserved and capacity counts no scratch.
    worker_slot: bool = True
    _itemsize: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "kv_heads", "head_dim", "tokens_per_frame", "block_size",
                     "frames_per_tick", "span_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sink_frames", "window_frames", "cross_tokens", "scratch_blocks",
                     "model_state_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tokens_per_frame % self.block_size:
            raise ValueError(
                f"block_size {self.block_size} must divide tokens_per_frame {self.tokens_per_frame}")
        if self.frames_per_tick % self.span_frames:
            raise ValueError(
                f"frames_per_tick {self.frames_per_tick} must be a multiple of "
                f"span_frames {self.span_frames}")
        if not self.branches or len(set(self.branches)) != len(self.branches):
            raise ValueError(f"branches must be non-empty and distinct, got {self.branches}")
        object.__setattr__(self, "_itemsize", torch.empty((), dtype=self.dtype).element_size())

    @property
    def itemsize(self) -> int:
        return self._itemsize

    @property
    def num_branches(self) -> int:
        return len(self.branches)

    @property
    def pages_per_frame(self) -> int:
        return self.tokens_per_frame // self.block_size

    @property
    def pages_per_tick(self) -> int:
        """Blocks one tick allocates per branch."""
        return self.frames_per_tick * self.pages_per_frame

    @property
    def block_bytes(self) -> int:
        """One block of one layer, K or V alone."""
        return self.block_size * self.kv_heads * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        """One block across all layers, K and V together: the capacity unit."""
        return self.num_layers * 2 * self.block_bytes

    @property
    def cross_bytes_per_branch(self) -> int:
        """One branch's cross-attention cache, all layers, K and V."""
        return self.num_layers * 2 * self.cross_tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def cross_bytes(self) -> int:
        """All branches' cross-attention caches of one session."""
        return self.num_branches * self.cross_bytes_per_branch

"""One chunk of DreamZero sampling over given K/V: 2 latent frames and 24 actions.

The K/V are plain tensors: each CFG branch is a ``Branch`` holding, per layer, its cached
video K/V (``[rows, frames * tokens, H, D]``, roped) and its cross K/V (``model.CrossKV``).
Branch 0 is the task prompt (conditional), branch 1 Wan's default negative prompt; both
cache the same frames, so their K/V have equal lengths and run as rows of one forward::

    rows = [branch 0 rows | branch 1 rows]
    for each step i (timestep t_i of the 16-step UniPC schedule, shift 5):
        if the DiT runs at step i:                      (every step, or DIT_STEPS_8)
            v, a = DiT(rows: x, y, t_i, actions, t_i, state)       # one forward, both branches
            video_flow  = v_neg + scale * (v_cond - v_neg)         # CFG on video only
            action_flow = a_cond                                   # actions: the conditional branch
        x       = video_scheduler.step(video_flow, t_i, x)
        actions = action_scheduler.step(action_flow, t_i, actions)

With one branch there is no guidance (both flows are that branch's). Nothing here
writes K/V: the caller's ``t = 0`` pass (``write_frames``) does, before the chunk.

``start_frame`` is one int for every row or ``[R]``, each row's own: rows of sessions at
different window positions (their own RoPE offsets, ``y`` slices and cached frames) share
every pass; the scheduler's step is elementwise, so a row's chunk is its chunk alone.

A CFG split over two ranks (``split``, a ``models.world.parallel.CfgSplit``): each rank's
forward runs its one branch's rows, and one all-gather a pass hands every rank both
branches' flows, so both take the same guided step (and hold the same ``x`` and actions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from models.policy.dreamzero.model import KV, CrossKV, DreamZeroDiT, PagedSelfKV
from models.policy.dreamzero.scheduler import (FLOW_SHIFT, GUIDANCE_SCALE, NUM_STEPS, dit_step_mask,
                                               make_scheduler)
from models.world.parallel.cfg import CfgSplit


@dataclass(frozen=True)
class Branch:
    """One CFG branch of a batch of rows: its cached video K/V and its cross K/V, per layer."""

    kv: list[KV] | None
    cross: list[CrossKV]


@torch.no_grad()
def write_frames(model: DreamZeroDiT, branches: Sequence[Branch], latents: torch.Tensor, y: torch.Tensor,
                 start_frame: int | torch.Tensor, *, paged: PagedSelfKV | None = None) -> list[Branch]:
    """The ``t = 0`` pass: real frames' latents ``[R, C, F, h, w]`` (the first frame, or a chunk's
    observation) attend the cache and come back as each branch's new cache. With ``paged`` the
    cache is kv/'s pool, which the pass writes (the branches come back as they were)."""
    out = _forward(model, branches, latents, y, torch.zeros(latents.shape[0], device=latents.device),
                   start_frame, paged=paged)
    if paged is not None:
        return list(branches)
    return [Branch(kv, b.cross) for b, kv in zip(branches, out.kv_per_branch)]


@torch.no_grad()
def denoise_chunk(model: DreamZeroDiT, branches: Sequence[Branch], noise_video: torch.Tensor,
                  noise_actions: torch.Tensor, state: torch.Tensor, y: torch.Tensor,
                  start_frame: int | torch.Tensor, *,
                  steps: int = NUM_STEPS, guidance: float = GUIDANCE_SCALE, shift: float = FLOW_SHIFT,
                  dit_steps: tuple[int, ...] | None = None,
                  paged: PagedSelfKV | None = None,
                  split: CfgSplit | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Denoise ``noise_video [R, out_dim, frames, h, w]`` and ``noise_actions [R, horizon, action_dim]``
    at ``start_frame`` given ``state [R, S, max_state_dim]`` and ``y`` (the I2V condition of those
    frames); returns (video latents, normalised actions), float32. ``paged``: the cache is kv/'s
    pool (the branches then carry cross K/V only). ``split``: ``branches`` is this rank's one
    branch, the other rank runs the other."""
    if len(branches) not in (1, 2):
        raise ValueError(f"one or two branches (conditional, negative), got {len(branches)}")
    if split is not None and len(branches) != 1:
        raise ValueError(f"a CFG split runs one branch a rank, got {len(branches)}")
    device = noise_video.device
    video_sched = make_scheduler(steps, shift, device)
    action_sched = make_scheduler(steps, shift, device)
    run = dit_step_mask(steps, dit_steps)
    x, a = noise_video.float(), noise_actions.float()
    stacked = _stack(branches)
    video_flow = action_flow = None
    for i, t in enumerate(video_sched.timesteps):
        if run[i]:
            R = x.shape[0]
            tt = t.to(device=device, dtype=torch.float32).expand(R)
            out = _forward(model, stacked, x, y, tt, start_frame, keep_kv=False, actions=a, action_timestep=tt,
                           state=state, paged=paged)
            if split is not None:
                v, act = zip(*split.both(out.video, out.actions))   # (cond, neg) each
            else:
                v, act = out.video.chunk(len(branches)), out.actions.chunk(len(branches))
            video_flow = v[1] + guidance * (v[0] - v[1]) if len(v) == 2 else v[0]
            action_flow = act[0]
        x = video_sched.step(video_flow, t, x, return_dict=False)[0]
        a = action_sched.step(action_flow, t, a, return_dict=False)[0]
    return x, a


# -- rows of both branches in one forward ----------------------------------------------------------

@dataclass(frozen=True)
class _Stacked:
    branches: int
    kv: list[KV] | None
    cross: list[CrossKV]


@dataclass(frozen=True)
class _Out:
    video: torch.Tensor
    actions: torch.Tensor | None
    kv_per_branch: list[list[KV]]


def _stack(branches: Sequence[Branch]) -> _Stacked:
    if isinstance(branches, _Stacked):
        return branches
    n = len(branches)
    if any((b.kv is None) != (branches[0].kv is None) for b in branches):
        raise ValueError("every branch has a cache or none does")
    kv = None
    if branches[0].kv is not None:
        kv = [(torch.cat([b.kv[i][0] for b in branches]), torch.cat([b.kv[i][1] for b in branches]))
              for i in range(len(branches[0].kv))]
    cross = [CrossKV(*(torch.cat([getattr(b.cross[i], f) for b in branches])
                       for f in ("k", "v", "k_img", "v_img")))
             for i in range(len(branches[0].cross))]
    return _Stacked(n, kv, cross)


def _forward(model: DreamZeroDiT, branches, latents: torch.Tensor, y: torch.Tensor, t: torch.Tensor,
             start_frame: int | torch.Tensor, keep_kv: bool = True, paged: PagedSelfKV | None = None,
             **register) -> _Out:
    s = _stack(branches)
    n = s.branches
    rep = {k: torch.cat([v] * n) for k, v in register.items()}
    if isinstance(start_frame, torch.Tensor):   # rows are branch-major: each branch's rows in turn
        start_frame = torch.cat([start_frame] * n)
    out = model(torch.cat([latents] * n), torch.cat([y] * n), torch.cat([t] * n), start_frame, s.cross, s.kv,
                keep_kv=keep_kv and paged is None, paged=paged, **rep)
    per = [[(k.chunk(n)[b], v.chunk(n)[b]) for k, v in out.kv] for b in range(n)]
    return _Out(out.video, out.actions, per)

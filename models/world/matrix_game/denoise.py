"""The few-step distilled denoising of one block, for a batch of sessions.

Schedule (upstream ``FlowMatchScheduler(shift=5, sigma_min=0, extra_one_step=True)`` with
1000 steps, and ``warp_denoising_step``): the variant's ``denoising_step_list`` (e.g.
1000, 666, 333) indexes the 1000-step table, ``t_i = table[1000 - step_i]``::

    sigma(u) = 5u / (1 + 4u),  u = 1 - j/1000,  table[j] = 1000 * sigma(u)
    universal / gta_drive:  1000, 666, 333        -> t = 1000.0, 908.9..., 714.2...
    templerun:              1000, 750, 500, 250   -> t = 1000.0, 937.5, 833.3..., 625.0

Per block, with noise ``n_0 .. n_{k-1}`` (upstream draws ``n_i`` for i > 0 with randn_like)::

    x = n_0
    for i, t in enumerate(ts):
        x0 = x - sigma(t) * flow(x, t)                 (float64, as upstream)
        if i < k - 1: x = (1 - sigma(t_{i+1})) x0 + sigma(t_{i+1}) n_{i+1}
    commit: flow(x0, t = 0)  -> its K/V (self, mouse, keyboard) become the session's cache

A denoising pass attends to the session's cache plus its own K/V and keeps nothing; only
the committing pass's K/V stay (upstream overwrites the same cache slots on every pass, so
the last write, the clean one, is what remains).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from models.world.matrix_game.config import CONTEXT_NOISE, TIMESTEP_SHIFT
from models.world.matrix_game.model import MatrixGameDiT, RowInput, SessionKV

TRAIN_STEPS = 1000


def sigma_table(shift: float = TIMESTEP_SHIFT, steps: int = TRAIN_STEPS) -> torch.Tensor:
    """The 1000 sigmas of the scheduler (float32, as torch computes them upstream)."""
    u = torch.linspace(1.0, 0.0, steps + 1)[:-1]
    return shift * u / (1 + (shift - 1) * u)


def distilled_timesteps(step_list: Sequence[int], shift: float = TIMESTEP_SHIFT) -> torch.Tensor:
    """``denoising_step_list`` warped onto the table: float32 timesteps, one per step."""
    table = torch.cat([sigma_table(shift) * TRAIN_STEPS, torch.zeros(1)])
    return table[TRAIN_STEPS - torch.tensor(list(step_list), dtype=torch.long)]


def sigma_of(t: torch.Tensor, shift: float = TIMESTEP_SHIFT) -> torch.Tensor:
    """sigma of each timestep: the table entry nearest to it (upstream's argmin lookup)."""
    sig = sigma_table(shift).to(t.device)
    idx = (sig[None] * TRAIN_STEPS - t.float()[:, None]).abs().argmin(1)
    return sig[idx]


@dataclass(frozen=True)
class BlockResult:
    latents: torch.Tensor           # [R, 16, F, h, w] float32: the clean block
    caches: list[SessionKV]         # per row: the cache after the block (from the committing pass)


# flow(x [R, 16, F, h, w] float32, t [R], commit) -> the flow of every row; ``commit``: the pass
# whose K/V the rows keep.
FlowFn = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


def denoise(flow: FlowFn, noise: Callable[[int], torch.Tensor], rows: int, step_list: Sequence[int],
            shift: float = TIMESTEP_SHIFT) -> torch.Tensor:
    """The few denoising steps of one block of ``rows`` rows, then the committing pass; returns
    the clean latents (float32). ``noise(i)``: the i-th draw ``[R, 16, F, h, w]`` (the first is
    the starting noise, the rest re-noise between steps)."""
    x = noise(0).float()
    ts = distilled_timesteps(step_list, shift).to(x.device)
    x0 = x
    for i, t in enumerate(ts):
        tt = t.expand(rows)
        f = flow(x, tt, False)
        sigma = sigma_of(tt[:1], shift).double()
        x0 = (x.double() - sigma * f.double()).float()
        if i + 1 < len(ts):
            nxt = sigma_of(ts[i + 1:i + 2], shift)
            x = ((1 - nxt) * x0 + nxt * noise(i + 1).float())
    flow(x0, torch.full((rows,), float(CONTEXT_NOISE), device=x0.device), True)
    return x0


def denoise_block(model: MatrixGameDiT, cond: torch.Tensor, rows: Sequence[RowInput],
                  noise: torch.Tensor, step_list: Sequence[int],
                  shift: float = TIMESTEP_SHIFT) -> BlockResult:
    """Run one block of every row over plain per-row caches: the few denoising steps, then the
    committing pass.

    ``cond``: ``[R, 20, F, h, w]``; ``noise``: ``[steps, R, 16, F, h, w]`` (the first is the
    starting noise, the rest re-noise between steps). Rows may sit at different positions
    with different caches and actions; each row's result is the same as running it alone.
    """
    if noise.shape[0] != len(step_list) or noise.shape[1] != len(rows):
        raise ValueError(f"noise must be [{len(step_list)} steps, {len(rows)} rows, ...], got {tuple(noise.shape)}")
    kept: list[list[SessionKV]] = []

    def flow(x: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
        out, caches = model(x, cond, t, rows)
        if commit:
            kept.append(caches)
        return out

    x0 = denoise(flow, lambda i: noise[i], len(rows), step_list, shift)
    return BlockResult(x0, kept[0])

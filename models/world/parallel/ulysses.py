"""Ulysses sequence parallel around attention, on ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Outside attention a rank holds a contiguous share of the block's tokens and every head;
inside attention it holds every token and ``H / N`` heads. Two all-to-alls per attention
(DeepSpeed-Ulysses), for ``x [R, L, H, D]`` over N = 2 ranks::

                 rank 0                          rank 1
    to_heads:    tokens 0..L0, heads 0..H         tokens L0..L, heads 0..H
                   |  send heads [0, H/2) to rank 0, [H/2, H) to rank 1  |
                 tokens 0..L, heads 0..H/2        tokens 0..L, heads H/2..H
    to_tokens:   the reverse

Shares are as even as possible: rank ``i`` holds ``L // N`` tokens, one more for the first
``L % N`` ranks (``token_shares``), so any token count splits; the heads must divide by N
(``check_heads``). Every tensor exchanged is contiguous and laid out rank by rank, so one
``all_to_all_single`` moves it with per-rank split sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist

from kv import KVGeometry
from models.base import EngineDeadError


def _collective(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; a failure is the group's, not the batch's: a rank that died or a
    wait past the group's timeout leaves the ranks out of step, so nothing can run on it again
    (``EngineDeadError``: the server fails every session and exits, realtime/engine/group.py)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - gloo raises RuntimeError, NCCL DistBackendError
        raise EngineDeadError(f"sequence-parallel {fn.__name__} failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    """The backend's message less its source location and advice: ``Connection reset by peer``."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0][:200]


def token_shares(tokens: int, ranks: int) -> list[int]:
    """Tokens each rank holds outside attention: ``tokens // ranks``, one more for the first
    ``tokens % ranks`` ranks (11 tokens over 4 ranks: 3, 3, 3, 2)."""
    base, extra = divmod(tokens, ranks)
    return [base + (1 if i < extra else 0) for i in range(ranks)]


def check_heads(heads: int, ranks: int) -> int:
    """Heads per rank; ``ValueError`` when ``heads`` does not divide by ``ranks``."""
    if ranks < 1 or heads % ranks:
        raise ValueError(f"sequence parallel over {ranks} ranks needs attention heads divisible by {ranks}, "
                         f"the model has {heads}")
    return heads // ranks


def per_rank_geometry(geometry: KVGeometry, ranks: int) -> KVGeometry:
    """``geometry`` as one rank of ``ranks`` stores it: ``kv_heads / ranks`` heads of every
    page and cross slot (capacity and admission then count one rank's bytes)."""
    return dataclasses.replace(geometry, kv_heads=check_heads(geometry.kv_heads, ranks))


def smallest(value: int, device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None) -> int:
    """The smallest of every rank's ``value`` in ``group`` (a capacity the ranks must agree on);
    ``device``: where the group's backend reduces (CUDA for NCCL)."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    _collective(dist.all_reduce, t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


class Ulysses:
    """One rank's view of the sequence-parallel group (the default process group, or ``group``)."""

    def __init__(self, rank: int, size: int, group: dist.ProcessGroup | None = None) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a group of {size}")
        self.rank, self.size, self.group = rank, size, group

    @classmethod
    def from_default_group(cls) -> "Ulysses | None":
        """The process's group when ``torch.distributed`` is initialised with more than one rank,
        else None (one process: no exchange)."""
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        return cls(dist.get_rank(), dist.get_world_size())

    def smallest(self, value: int, device: torch.device | str = "cpu") -> int:
        """The smallest of every rank's ``value`` (a capacity the ranks must agree on); ``device``:
        where the group's backend reduces (CUDA for NCCL)."""
        return smallest(value, device, self.group)

    # -- tokens ----------------------------------------------------------------------------

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's share of ``x``'s tokens along ``dim``."""
        shares = token_shares(x.shape[dim], self.size)
        start = sum(shares[:self.rank])
        return x.narrow(dim, start, shares[self.rank])

    def gather(self, x: torch.Tensor, tokens: int) -> torch.Tensor:
        """Every rank's share of ``tokens`` along dim 1, joined in rank order: ``[R, tokens, ...]``
        on every rank."""
        shares = token_shares(tokens, self.size)
        most = shares[0]
        padded = x if x.shape[1] == most else torch.cat([x, x.new_zeros(x.shape[0], most - x.shape[1],
                                                                        *x.shape[2:])], 1)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        _collective(dist.all_gather, parts, padded.contiguous(), group=self.group)
        return torch.cat([p[:, :n] for p, n in zip(parts, shares)], 1)

    # -- heads -----------------------------------------------------------------------------

    def own_heads(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """This rank's heads of ``x`` (text K/V ``[B, T, H, D]``: dim 2)."""
        h = check_heads(x.shape[dim], self.size)
        return x.narrow(dim, self.rank * h, h)

    def to_heads(self, x: torch.Tensor, tokens: int) -> torch.Tensor:
        """``[R, share, H, D]`` (this rank's tokens, every head) -> ``[R, tokens, H/N, D]``
        (every token, this rank's heads). Rows are independent: q, k and v concatenated
        along dim 0 go in one exchange."""
        R, share, H, D = x.shape
        h = check_heads(H, self.size)
        shares = token_shares(tokens, self.size)
        # Send buffer rank by rank: the heads rank j attends, of this rank's tokens.
        send = x.view(R, share, self.size, h, D).permute(2, 0, 1, 3, 4).contiguous()
        recv = x.new_empty(R * tokens * h * D)
        _collective(dist.all_to_all_single, recv, send.view(-1), [n * R * h * D for n in shares],
                               [share * R * h * D] * self.size, group=self.group)
        parts = recv.split([n * R * h * D for n in shares])
        return torch.cat([p.view(R, n, h, D) for p, n in zip(parts, shares)], 1)

    def to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, tokens, H/N, D]`` -> ``[R, share, H, D]``: the reverse of ``to_heads``."""
        R, tokens, h, D = x.shape
        shares = token_shares(tokens, self.size)
        share = shares[self.rank]
        # Send buffer rank by rank: rank j's tokens, of this rank's heads.
        send = torch.cat([p.reshape(-1) for p in x.split(shares, 1)])
        recv = x.new_empty(self.size * R * share * h * D)
        _collective(dist.all_to_all_single, recv, send, [share * R * h * D] * self.size,
                               [n * R * h * D for n in shares], group=self.group)
        # recv: [source rank (= head group), R, share, h, D] -> [R, share, H, D]
        return recv.view(self.size, R, share, h, D).permute(1, 2, 0, 3, 4).reshape(R, share, self.size * h, D)

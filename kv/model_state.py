"""Model-owned per-session state that lives and moves with the session's KV.

Some models keep per-session tensors beside their attention KV, e.g. the Wan VAE's
causal-conv decode caches (``models/world/wan_vae.py``, 603 MiB per session for
DreamZero). ``Residency`` counts such a state in the host budget, moves it to the
host with the session's KV when the session is evicted, back when it ticks
again, and frees it when the session closes or is dropped. Capacity planning
counts it through ``KVGeometry.model_state_bytes``; a state larger than that is
refused at ``Residency.attach_state``.

Anything with the four members of ``ModelState`` qualifies; ``TensorState`` is
the plain container (a tuple of tensors) for models that need nothing else.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ModelState(Protocol):
    """What ``Residency`` needs from a model-owned state."""

    @property
    def nbytes(self) -> int: ...

    def to_host(self) -> None:
        """Move every tensor to host memory (pinned when it was on CUDA)."""

    def to_device(self, device: torch.device | str) -> None:
        """Move every tensor back to ``device``, bit-exactly."""

    def free(self) -> None:
        """Release every tensor (session close or drop)."""


class TensorState:
    """A tuple of tensors as model-owned state (``ModelState``)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        self._tensors: tuple[torch.Tensor, ...] | None = tuple(tensors)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        if self._tensors is None:
            raise RuntimeError("the state was freed")
        return self._tensors

    @property
    def nbytes(self) -> int:
        if self._tensors is None:
            return 0
        return sum(t.numel() * t.element_size() for t in self._tensors)

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def to_host(self) -> None:
        pin = any(t.is_cuda for t in self.tensors)
        host = []
        for t in self.tensors:
            h = torch.empty_like(t, device="cpu", pin_memory=pin)
            h.copy_(t, non_blocking=pin)
            host.append(h)
        if pin:
            torch.cuda.synchronize()
        self._tensors = tuple(host)

    def to_device(self, device: torch.device | str) -> None:
        self._tensors = tuple(t.to(device) for t in self.tensors)

    def free(self) -> None:
        self._tensors = None

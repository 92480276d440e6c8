"""The scripted data policy: hold a key combination for 1-8 frames, forward-biased.

Each camera draws a combination from ``COMBOS`` (weights in ``WEIGHTS``: plain
forward three times as likely as any other) and holds it for a uniform 1..8
frames, then draws again. The draws come from a ``torch.Generator`` on the
sim's device, so a seeded policy is deterministic per device.
"""

from __future__ import annotations

import torch

from models.base import ACTION_KEYS

# Key combinations, as strings of held keys ('' = nothing held).
COMBOS: tuple[str, ...] = ("w", "j", "l", "wj", "wl", "a", "d", "s", "i", "k", "", "wa", "wd")
WEIGHTS: tuple[float, ...] = (4.0, 1.5, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 0.5, 0.5)
MAX_HOLD = 8


def combo_bits(combo: str) -> list[float]:
    return [1.0 if k in combo else 0.0 for k in ACTION_KEYS]


class ScriptedPolicy:
    """Sticky random key combos for a batch of ``batch`` cameras."""

    def __init__(self, batch: int, seed: int, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)
        self.table = torch.tensor([combo_bits(c) for c in COMBOS], device=self.device)
        self.probs = torch.tensor(WEIGHTS, device=self.device) / sum(WEIGHTS)
        self.current = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.left = torch.zeros(batch, dtype=torch.int64, device=self.device)  # frames still to hold

    def next(self) -> torch.Tensor:
        """The actions for the next frame, [batch, 8] float 0/1."""
        b = self.current.shape[0]
        draw = torch.multinomial(self.probs, b, replacement=True, generator=self.gen)
        hold = torch.randint(1, MAX_HOLD + 1, (b,), generator=self.gen, device=self.device)
        redraw = self.left <= 0
        self.current = torch.where(redraw, draw, self.current)
        self.left = torch.where(redraw, hold, self.left) - 1
        return self.table[self.current]

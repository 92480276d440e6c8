"""The scripted data policy: hold a key combination for 1-8 frames, forward-biased.

Each camera draws a combination from ``COMBOS`` (weights in ``WEIGHTS``: plain
forward four times as likely as most others; training may use ``BALANCED_WEIGHTS``) and holds it for a uniform 1..8
frames, then draws again. The draws come from a ``torch.Generator`` on the
sim's device, so a seeded policy is deterministic per device.
"""

from __future__ import annotations

import torch

from models.world.base import action_bits

# Key combinations, as strings of held keys ('' = nothing held).
COMBOS: tuple[str, ...] = ("w", "j", "l", "wj", "wl", "a", "d", "s", "i", "k", "", "wa", "wd")
WEIGHTS: tuple[float, ...] = (4.0, 1.5, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 0.5, 0.5)
# A training mix with more of what the gates probe: backwards, standing still.
BALANCED_WEIGHTS: tuple[float, ...] = (3.0, 1.5, 1.5, 1.0, 1.0, 1.0, 1.0, 1.5, 0.5, 0.5, 1.5, 0.5, 0.5)
POLICY_WEIGHTS = {"default": WEIGHTS, "balanced": BALANCED_WEIGHTS}
MAX_HOLD = 8


def combo_bits(combo: str) -> list[float]:
    return action_bits(frozenset(combo))


class ScriptedPolicy:
    """Sticky random key combos for a batch of ``batch`` cameras."""

    def __init__(self, batch: int, seed: int, device: str | torch.device = "cpu",
                 weights: tuple[float, ...] = WEIGHTS) -> None:
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)
        self.table = torch.tensor([combo_bits(c) for c in COMBOS], device=self.device)
        if len(weights) != len(COMBOS):
            raise ValueError(f"{len(weights)} policy weights for {len(COMBOS)} key combinations")
        self.probs = torch.tensor(weights, device=self.device) / sum(weights)
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

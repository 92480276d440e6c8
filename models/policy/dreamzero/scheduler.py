"""The sampler: UniPC multistep for flow prediction, 16 steps, flow shift 5.

Upstream builds Wan's ``FlowUniPCMultistepScheduler(shift=1)`` and calls
``set_timesteps(16, shift=5)``: sigmas ``shift(linspace(0.999, 0, 17)[:-1])`` with
``shift(s) = 5 s / (1 + 4 s)``, a final sigma of 0, timesteps ``int64(1000 * sigma)``,
order 2 with the order lowered on the last step, the ``bh2`` corrector. diffusers'
``UniPCMultistepScheduler`` with ``use_flow_sigmas=True, flow_shift=5`` makes the same
updates (x0 = x - sigma * flow, alpha = 1 - sigma) and shifts and truncates the same way,
but its own unshifted sigmas start at 1 (``linspace(1, 1/1000, 17)``), so Wan's
``linspace(0.999, 0, 17)`` is passed in as ``sigmas``. The video and the actions each keep
one scheduler (their own multistep history).

``DIT_STEPS_8`` is upstream's default DiT cache: the DiT runs on these 8 of the 16 steps
and the others reuse the last flows (the scheduler still steps).
"""

from __future__ import annotations

import numpy as np
import torch

NUM_STEPS = 16
FLOW_SHIFT = 5.0
GUIDANCE_SCALE = 5.0
DIT_STEPS_8 = (0, 1, 2, 6, 10, 13, 14, 15)


def make_scheduler(steps: int = NUM_STEPS, shift: float = FLOW_SHIFT,
                   device: torch.device | str | None = None):
    """A fresh ``UniPCMultistepScheduler`` set to ``steps`` (one per denoised quantity and chunk)."""
    from diffusers import UniPCMultistepScheduler

    s = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                predict_x0=True, solver_type="bh2", lower_order_final=True,
                                use_flow_sigmas=True, flow_shift=float(shift), final_sigmas_type="zero")
    # Wan builds its scheduler at shift 1 over 1000 steps: sigma_max 0.999, sigma_min 0.
    s.set_timesteps(sigmas=np.linspace(0.999, 0.0, steps + 1)[:-1], device=device)
    return s


def dit_step_mask(steps: int, dit_steps: tuple[int, ...] | None) -> tuple[bool, ...]:
    """Which steps run the DiT: all (None) or the listed ones; step 0 must be one of them."""
    if dit_steps is None:
        return (True,) * steps
    bad = [i for i in dit_steps if not 0 <= i < steps]
    if bad or 0 not in dit_steps:
        raise ValueError(f"dit_steps must include 0 and lie in 0..{steps - 1}, got {dit_steps}")
    return tuple(i in dit_steps for i in range(steps))

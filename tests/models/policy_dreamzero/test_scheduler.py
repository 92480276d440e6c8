"""The 16-step UniPC schedule (flow shift 5) and one step, by hand."""

from __future__ import annotations

import pytest
import torch

from models.policy.dreamzero.scheduler import DIT_STEPS_8, dit_step_mask, make_scheduler


def shifted(s: float) -> float:
    return 5.0 * s / (1.0 + 4.0 * s)


def test_schedule_is_upstreams():
    s = make_scheduler()
    # Upstream: sigmas shift(linspace(0.999, 0, 17)[:-1]), then 0; timesteps int64(1000 * sigma).
    base = [0.999 * (16 - i) / 16 for i in range(16)]
    want = [shifted(b) for b in base]
    assert s.sigmas[:16].tolist() == pytest.approx(want, abs=1e-6) and s.sigmas[16].item() == 0.0
    assert s.timesteps.tolist() == [int(1000 * w) for w in want]
    assert s.timesteps[:4].tolist() == [999, 986, 972, 955]


def test_first_step_by_hand():
    # The first UniPC step is first order, which for flow prediction is an Euler step:
    # x0 = x - s0 v; x1 = (s1/s0)(x - (1-s0) x0) + (1-s1) x0 = x + (s1 - s0) v.
    s0, s1 = shifted(0.999), shifted(0.999 * 15 / 16)        # 4.995 / 4.996, 4.6828125 / 4.74625
    assert (s0, s1) == pytest.approx((0.9997998399, 0.9866341849), abs=1e-9)
    x = torch.tensor([1.0, -2.0, 0.5])
    v = torch.tensor([0.5, 1.0, -4.0])
    sched = make_scheduler()
    out = sched.step(v, sched.timesteps[0], x, return_dict=False)[0]
    want = torch.tensor([1.0 + 0.5 * (s1 - s0), -2.0 + (s1 - s0), 0.5 - 4.0 * (s1 - s0)])
    assert torch.allclose(out, want, atol=1e-6)
    assert out[0].item() == pytest.approx(0.99341717, abs=1e-6)


def test_dit_step_mask():
    assert dit_step_mask(16, None) == (True,) * 16
    m = dit_step_mask(16, DIT_STEPS_8)
    assert sum(m) == 8 and [i for i, r in enumerate(m) if r] == [0, 1, 2, 6, 10, 13, 14, 15]
    with pytest.raises(ValueError, match="include 0"):
        dit_step_mask(16, (1, 2))

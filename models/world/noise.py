"""Counter-based Gaussian noise: a session's noise is a function of (seed, counter) only.

A batched world draws the noise of many sessions at once. Drawn from one generator,
a session's values would depend on which sessions shared its batches and in what
order; drawn from one generator per session, a batch would cost one draw (and on
CUDA one launch) per row. Here every row's values are a pure function of that row's
``seed``, its ``counter`` (the position in the session: frame, block, denoising
step, as the model numbers its draws) and the element's index, computed for the
whole batch in one set of elementwise tensor ops: no generator state, nothing read
back to the host, the same kernels at any batch size (so it can be captured in a
CUDA graph with the seeds and counters as static inputs)::

    key[r]     = mix(mix(seed[r] + G) + counter[r])            one 64-bit key per row
    bits[r, e] = mix(key[r] + (e + 1) * G)                     splitmix64's e-th output
    u1 = (bits >> 40 (24 bits) + 1) / 2**24  in (0, 1]
    u2 = (bits >> 16 & 2**24 - 1) / 2**24    in [0, 1)
    noise[r, e] = sqrt(-2 ln u1) * cos(2 pi u2)                Box-Muller, one value per output

``mix`` is splitmix64's finaliser (a bijection of 64-bit words) and ``G`` its
increment, the golden ratio in 64 bits: row ``r`` reads the splitmix64 stream that
starts at ``key[r]``. The 64-bit arithmetic is done on int64 tensors, whose
multiplications wrap modulo 2**64 on CPU and CUDA alike; a right shift of an int64
copies the sign bit, so every shift is masked back to a logical one.

The values are standard normal (24-bit uniforms: ``|noise| <= 5.77``, a tail
cut with probability 8e-9 per value). The integers are exact everywhere; the
float steps (log, sqrt, cos) are elementwise, so on one device a row's values do
not depend on its batch, and CPU and CUDA agree to a few float32 ulps.
"""

from __future__ import annotations

import math

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_U24 = (1 << 24) - 1


def int64_bits(x: int) -> int:
    """Any int's low 64 bits as the int64 with those bits (a seed as a ``seeds`` entry)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN, MUL1, MUL2 = int64_bits(_GOLDEN), int64_bits(_MUL1), int64_bits(_MUL2)


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 words by ``n`` (0 < n < 64), as a new tensor."""
    return (x >> n).bitwise_and_((1 << (64 - n)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 words (elementwise, wrapping), in place on ``x``."""
    x.bitwise_xor_(_shr(x, 30)).mul_(MUL1)
    x.bitwise_xor_(_shr(x, 27)).mul_(MUL2)
    return x.bitwise_xor_(_shr(x, 31))


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One int64 key per row from int64 ``seeds`` and ``counters`` (same shape)."""
    return mix(mix(seeds + GOLDEN).add_(counters))


def normal(seeds: torch.Tensor, counters: torch.Tensor, shape: tuple[int, ...],
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal noise ``[B, *shape]``: row ``r`` a function of (``seeds[r]``, ``counters[r]``)
    and the element's index only.

    ``seeds``, ``counters``: int64 ``[B]`` on the device the noise is made on. Computed in
    float32 whatever ``dtype`` (then cast), so a row's values do not depend on it. The ops
    work in place where they can: half the time of fresh tensors on CPU at 4 to 32 rows.
    """
    n = math.prod(shape)
    steps = torch.arange(1, n + 1, dtype=torch.int64, device=seeds.device).mul_(GOLDEN)  # wraps as the stream
    bits = mix(steps + row_keys(seeds, counters)[:, None])                                # [B, n]
    u1 = _shr(bits, 40).add_(1).float().mul_(1.0 / (1 << 24))
    u2 = bits.bitwise_right_shift_(16).bitwise_and_(_U24).float().mul_(2.0 * math.pi / (1 << 24))
    z = u1.log_().mul_(-2.0).sqrt_().mul_(u2.cos_())
    return z.view(len(seeds), *shape).to(dtype)

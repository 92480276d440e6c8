"""Counter-based noise: the definition, a row's independence of its batch, the distribution."""

import math

import pytest
import torch

from models.world.noise import int64_bits, normal, row_keys

SHAPE = (3, 64, 64)  # the maze's frame
M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser on Python ints."""
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference(seed: int, counter: int, n: int) -> list[float]:
    """A row's first ``n`` values by the module's definition, in plain Python (float64)."""
    golden = 0x9E3779B97F4A7C15
    key = mix64(mix64(seed + golden) + counter)
    out = []
    for e in range(n):
        bits = mix64(key + (e + 1) * golden)
        u1 = ((bits >> 40) + 1) / (1 << 24)
        u2 = ((bits >> 16) & ((1 << 24) - 1)) / (1 << 24)
        out.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    return out


def rows(seeds: list[int], counters: list[int], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([int64_bits(s) for s in seeds], device=device),
            torch.tensor(counters, dtype=torch.int64, device=device))


def test_values_are_the_plain_python_definition():
    seeds = [0, 1, 7, 2**31 - 1, 2**40 + 3, -1]
    counters = [0, 0, 5, 1, 9, 2**33]
    z = normal(*rows(seeds, counters), (5, 7))
    for r, (s, c) in enumerate(zip(seeds, counters)):
        want = torch.tensor(reference(s, c, 35), dtype=torch.float64)
        # float32 log / cos against float64: a few float32 ulps
        assert torch.allclose(z[r].flatten().double(), want, atol=4e-6, rtol=0), (s, c)
    # the 64-bit hash itself is exact (splitmix64 of splitmix64, wrapping like a 64-bit word)
    for s, c in zip(seeds, counters):
        assert row_keys(*rows([s], [c])).item() == int64_bits(mix64(mix64(s + 0x9E3779B97F4A7C15) + c))


def test_int64_bits_wraps_like_a_64_bit_word():
    assert [int64_bits(x) for x in (0, 5, 2**63 - 1, 2**63, 2**64 - 1, 2**64 + 5, -1)] == [
        0, 5, 2**63 - 1, -2**63, -1, 5, -1]


def test_a_row_is_the_same_alone_in_any_batch_at_any_position():
    seeds, counters = [3, 3, 9, 1, 3], [1, 2, 1, 1, 1]
    batch = normal(*rows(seeds, counters), SHAPE)
    for r, (s, c) in enumerate(zip(seeds, counters)):
        assert torch.equal(normal(*rows([s], [c]), SHAPE)[0], batch[r])
    flipped = normal(*rows(seeds[::-1], counters[::-1]), SHAPE)
    assert torch.equal(flipped, batch.flip(0))
    assert torch.equal(batch[0], batch[4])            # the same (seed, counter): the same noise
    assert not torch.equal(batch[0], batch[1])        # another counter
    assert not torch.equal(batch[0], batch[2])        # another seed
    assert torch.equal(normal(*rows(seeds, counters), SHAPE, dtype=torch.bfloat16), batch.to(torch.bfloat16))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_row_does_not_depend_on_the_thread_split(threads):
    """Intra-op threads split a batch's elements at other places than rows: every element is
    computed by the same vector code wherever the split falls."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for B in (1, 3, 7, 13):
            seeds = list(range(100, 100 + B))
            batch = normal(*rows(seeds, [4] * B), SHAPE)
            assert all(torch.equal(normal(*rows([s], [4]), SHAPE)[0], batch[i]) for i, s in enumerate(seeds))
    finally:
        torch.set_num_threads(before)


def test_standard_normal_and_independent():
    n_rows = 64
    z = normal(*rows(list(range(32)) * 2, [0] * 32 + [1] * 32), SHAPE).double().reshape(n_rows, -1)
    x = z.flatten()
    n = x.numel()  # 786,432 values
    assert abs(x.mean().item()) < 5 / math.sqrt(n)                      # 5 sigma of the sample mean
    assert abs(x.std().item() - 1) < 5 / math.sqrt(2 * n)
    skew, kurt = (x ** 3).mean().item(), (x ** 4).mean().item()
    assert abs(skew) < 5 * math.sqrt(6 / n) and abs(kurt - 3) < 5 * math.sqrt(24 / n)
    # the distribution function, against the normal's at 41 points (Kolmogorov-Smirnov)
    grid = torch.linspace(-4, 4, 41, dtype=torch.float64)
    empirical = (x[:, None] <= grid).double().mean(0)
    assert (empirical - torch.special.ndtr(grid)).abs().max().item() < 1.63 / math.sqrt(n)  # p = 0.01
    assert x.abs().max().item() <= math.sqrt(-2 * math.log(2.0 ** -24)) + 1e-6
    # rows of neighbouring seeds, of neighbouring counters, and neighbouring values: uncorrelated
    c = torch.corrcoef(z)
    off = c[~torch.eye(n_rows, dtype=torch.bool)]
    per_row = z.shape[1]
    assert off.abs().max().item() < 5 / math.sqrt(per_row)
    lag = torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item()
    assert abs(lag) < 5 / math.sqrt(n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_makes_the_cpu_values_to_float32_rounding_and_rows_stay_their_own():
    seeds, counters = list(range(40)), [i % 5 for i in range(40)]
    cpu = normal(*rows(seeds, counters), SHAPE)
    gpu = normal(*rows(seeds, counters, "cuda"), SHAPE)
    # the integers are exact on both; log and cos differ by a few ulps
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-5, rtol=0), (gpu.cpu() - cpu).abs().max()
    for r in (0, 17, 39):
        assert torch.equal(normal(*rows([seeds[r]], [counters[r]], "cuda"), SHAPE)[0], gpu[r])

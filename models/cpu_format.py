"""Which number format a model's CPU products run in: float32, or bfloat16 where it is faster.

bfloat16 halves the bytes a matrix product reads, but only a CPU with native bf16
arithmetic (AMX tiles, or AVX512-BF16) computes it faster than float32; elsewhere
every bf16 op converts to float32 and back and the model gets slower (2.8x on an
AVX2 EPYC, ``bench/results/maze_cpu_ab_shared.json``). So a model that can run
its products in bf16 keeps float32 unless this CPU reports native bf16, and then
times one steady-state pass in each format at load (a fraction of a second) and
keeps the faster. What each format does to the output is the model card's to
measure; this module only answers "which is faster here".
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Mapping

import torch

from models.factory import CPU_FORMATS, BuildOptions

log = logging.getLogger(__name__)


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AMX tiles or AVX512-BF16), per torch's own checks."""
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def steady_ms(run: Callable[[], object], warm: int = 2, repeats: int = 5) -> float:
    """Median ms of ``repeats`` calls of ``run`` after ``warm`` untimed ones."""
    times = []
    for i in range(warm + repeats):
        t0 = time.perf_counter()
        run()
        if i >= warm:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def format_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def named_format(name: str) -> torch.dtype:
    """``BuildOptions.cpu_format`` (one of ``models.factory.CPU_FORMATS``) as a dtype."""
    if name not in CPU_FORMATS:
        raise ValueError(f"cpu format {name!r} is not one of {CPU_FORMATS}")
    return getattr(torch, name)


def chosen_format(options: BuildOptions) -> torch.dtype | None:
    """The CPU format ``options`` fixes for a model on the CPU; None: the model picks (or runs on a GPU)."""
    if options.cpu_format is None or options.device != "cpu":
        return None
    return named_format(options.cpu_format)


def faster_format(what: str, passes: Mapping[torch.dtype, Callable[[], float]],
                  rounds: int = 2) -> tuple[torch.dtype, dict[str, Any]]:
    """The format whose pass (a callable returning its steady-state ms) is fastest;
    (format, ``{"pass_ms": {name: ms}, "picked": name}``).

    The rounds interleave the formats and keep each one's best: a format's first
    passes also pay for its kernels' setup, and a neighbour's burst on a shared
    machine hits one round only."""
    timings: dict[str, float] = {}
    for _ in range(rounds):
        for dtype, run in passes.items():
            ms = run()
            name = format_name(dtype)
            timings[name] = min(ms, timings.get(name, ms))
    best = min(passes, key=lambda dt: timings[format_name(dt)])
    log.info("%s CPU number format: %s (one pass: %s ms)", what, format_name(best),
             {k: round(v, 1) for k, v in timings.items()})
    return best, {"pass_ms": timings, "picked": format_name(best)}

"""Streaming polyphase resampling (22,050 -> 24,000 Hz for the joe voice) in torch.

With ``L/M = out_rate/in_rate`` in lowest terms (160/147 here), output sample n
sits at input time ``t = n*M/L``. Write ``b = floor(n*M/L)`` and phase
``p = n*M mod L``; then::

    y[n] = sum_{j=0}^{2K-1} x[b - K + 1 + j] * bank[p, j]
    bank[p, j] = h(p/L + K - 1 - j)      (h: Kaiser-windowed sinc, |d| <= K)

    input      ... x[b-K+1] ........ x[b] | x[b+1] ........ x[b+K] ...
                                          t = n*M/L
    y[n] needs every input up to x[b+K]: K samples (0.7 ms) of look-ahead.

The signal is taken as zero before 0 and after its last sample, and it yields
``ceil(N*L/M)`` outputs for N inputs. A stream keeps the inputs that later outputs
still read (``ResamplerState``); each ``push`` emits every output whose inputs
have all arrived, ``finish`` emits the rest against trailing zeros. Every output
is the same dot product over the same values however the input is split, so a
streamed signal equals the whole signal resampled in one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ResamplerState:
    """Immutable, so keeping the previous one is a free snapshot."""

    pending: torch.Tensor  # inputs from global index ``base`` on (1-D float32, CPU)
    base: int
    received: int  # inputs seen so far
    produced: int  # outputs emitted so far


class PolyphaseResampler:
    def __init__(self, in_rate: int, out_rate: int, half_width: int = 16, rolloff: float = 0.945, beta: float = 8.6):
        g = math.gcd(in_rate, out_rate)
        self.in_rate, self.out_rate = in_rate, out_rate
        self.up, self.down = out_rate // g, in_rate // g
        # Cut off just below the lower of the two Nyquist rates (in input-sample units).
        cutoff = rolloff * min(1.0, self.up / self.down)
        self.half = int(math.ceil(half_width / min(1.0, self.up / self.down)))
        phases = torch.arange(self.up, dtype=torch.float64)[:, None] / self.up
        taps = torch.arange(2 * self.half, dtype=torch.float64)[None, :]
        d = phases + self.half - 1 - taps  # distance from output time to each input, in input samples
        window = torch.special.i0(beta * torch.sqrt(torch.clamp(1 - (d / self.half) ** 2, min=0))) / torch.special.i0(
            torch.tensor(beta, dtype=torch.float64)
        )
        bank = cutoff * torch.sinc(cutoff * d) * window
        # Every phase sums to exactly 1: no DC ripple at the output rate.
        self.bank = (bank / bank.sum(dim=1, keepdim=True)).to(torch.float32)
        self._taps = torch.arange(2 * self.half)

    def output_length(self, n_in: int) -> int:
        return -(-n_in * self.up // self.down)

    def start(self) -> ResamplerState:
        return ResamplerState(torch.zeros(self.half - 1), -(self.half - 1), 0, 0)

    def _emit(self, pending: torch.Tensor, base: int, produced: int, stop: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Outputs [produced, stop) from ``pending``; returns them, the new base and
        the trimmed pending buffer."""
        n = torch.arange(produced, stop, dtype=torch.int64)
        first = (n * self.down) // self.up - self.half + 1 - base
        y = (pending[first[:, None] + self._taps[None, :]] * self.bank[(n * self.down) % self.up]).sum(-1)
        next_first = (stop * self.down) // self.up - self.half + 1
        keep = max(0, min(next_first - base, pending.numel()))
        return y, base + keep, pending[keep:]

    def push(self, state: ResamplerState, x: torch.Tensor) -> tuple[torch.Tensor, ResamplerState]:
        """Feed ``x`` (1-D float32 CPU); returns every output now computable."""
        pending = torch.cat([state.pending, x.to(torch.float32).reshape(-1)])
        received = state.received + x.numel()
        # Largest n with floor(n*M/L) + K <= received - 1.
        stop = max(state.produced, ((received - self.half) * self.up - 1) // self.down + 1) if received > self.half else state.produced
        y, base, pending = self._emit(pending, state.base, state.produced, stop)
        return y, ResamplerState(pending, base, received, stop)

    def finish(self, state: ResamplerState) -> tuple[torch.Tensor, ResamplerState]:
        """The remaining outputs, reading zeros past the end of the signal."""
        pending = torch.cat([state.pending, torch.zeros(self.half)])
        stop = self.output_length(state.received)
        y, base, pending = self._emit(pending, state.base, state.produced, stop)
        return y, ResamplerState(pending, base, state.received, stop)

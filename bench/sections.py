"""A benchmark run as a list of sections under a time budget.

A run's JSON is rewritten when each section ends, so a run cut short (the machine's lease, a
crash in a later section) still leaves the figures it made; a section that fails records its
error and the run goes on with the next one.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Sequence

from bench.report import emit


class Sections:
    """The sections of one run: ``section(name, fn)`` runs ``fn`` when ``name`` is wanted (in
    ``only``) and the run is within ``budget_s`` of ``start``, puts what it returns (or its
    error) in ``result`` and rewrites ``out``."""

    def __init__(self, result: dict[str, Any], out: str, only: Sequence[str], budget_s: float, start: float,
                 log: Callable[[str], None]) -> None:
        self.result, self.out, self.budget_s, self.start, self.log = result, out, budget_s, start, log
        self.want = set(only).__contains__
        result.setdefault("skipped", {})
        result.setdefault("errors", {})

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        emit({k: v for k, v in self.result.items() if not callable(v)}, self.out, echo=False)

    def budget_ok(self, name: str) -> bool:
        """Whether ``name`` may start: False (and ``name`` recorded as skipped) once the budget is spent."""
        if time.perf_counter() - self.start > self.budget_s:
            self.result["skipped"][name] = f"time budget ({self.budget_s:.0f} s) spent"
            self.log(f"{name}: skipped (budget)")
            return False
        return True

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        if not self.want(name) or not self.budget_ok(name):
            return None
        self.log(f"{name} ...")
        self.attempt(name, lambda: self.result.__setitem__(name, fn()))
        self.save()
        return self.result.get(name)

    def attempt(self, name: str, fn: Callable[[], Any]) -> None:
        """``fn()``; an exception is printed and recorded as ``name``'s error (the other
        sections' figures are kept)."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded in the JSON, the run goes on
            traceback.print_exc()
            self.result["errors"][name] = f"{type(e).__name__}: {e}"

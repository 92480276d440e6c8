"""What the end-to-end bench tests share: a bench's ``main`` run on its tiny sizes on CPU, and
the check that a figure is a real number."""

from __future__ import annotations

import importlib
import json
import math
import sys
from typing import Any, Callable

import pytest
import torch

from realtime.server.inventory import on_spent_thread


def real(x: Any) -> bool:
    """``x`` is a finite int or float (not a bool, not None)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture
def run_tiny(tmp_path, monkeypatch) -> Callable[..., dict]:
    """``run_tiny(module, *flags)``: ``module.main`` with ``--tiny --device cpu --threads 1`` and
    ``flags``, on a thread of its own as the engine's; returns the JSON it wrote. Torch's thread
    count is put back afterwards."""
    threads = torch.get_num_threads()

    def run(module: str, *flags: str) -> dict:
        main = importlib.import_module(module).main
        out = tmp_path / "bench.json"
        monkeypatch.setattr(sys, "argv", [module.rsplit(".", 1)[-1], "--tiny", "--device", "cpu", "--threads", "1",
                                          "--out", str(out), *flags])
        on_spent_thread(main)
        return json.loads(out.read_text())

    yield run
    torch.set_num_threads(threads)

"""``models.cpu_format``: the faster format by interleaved timed passes; format names."""

import pytest
import torch

from models.cpu_format import faster_format, named_format
from models.factory import CPU_FORMATS


def test_the_faster_format_is_each_ones_best_round():
    times = {torch.float32: iter([30.0, 10.0]), torch.bfloat16: iter([20.0, 25.0])}
    order = []

    def timer(dt):
        def run():
            order.append(dt)
            return next(times[dt])
        return run

    best, pick = faster_format("test", {dt: timer(dt) for dt in times})
    assert order == [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]  # interleaved
    assert (best, pick) == (torch.float32, {"pass_ms": {"float32": 10.0, "bfloat16": 20.0}, "picked": "float32"})


def test_names_are_the_factory_table_s():
    assert [named_format(n) for n in CPU_FORMATS] == [torch.float32, torch.bfloat16]
    with pytest.raises(ValueError, match="float16"):
        named_format("float16")

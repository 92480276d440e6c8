"""bench/openpi/standin_latency.py end to end, tiny: both servers answer the real client and
the report holds a round per server with the stand-in policy's time taken out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_round_each(tmp_path):
    out = tmp_path / "standin.json"
    subprocess.run([sys.executable, "-m", "bench.openpi.standin_latency", "--rounds", "1", "--seconds", "0.3",
                    "--warmup-robots", "0", "--infer-ms", "5", "--out", str(out)], cwd=ROOT, check=True, timeout=240,
                   capture_output=True)
    report = json.loads(out.read_text())
    for kind in ("ours", "reference"):
        (row,) = report["rounds"][kind]
        assert row["calls"] > 0
        assert row["call_ms_p50"] >= 5.0  # the policy's own time is in every call
        assert row["protocol_ms_p50"] == round(row["call_ms_p50"] - 5.0, 3)
    assert report["ratio_ours_over_reference"] > 0

"""bench/pi0/ab_checkouts.py end to end, tiny on CPU: a worker per checkout (this one, and a copy
of its models/ protocols/ kv/ as the baseline), both answer, and the report holds every round."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_checkouts_alternate(tmp_path):
    base = tmp_path / "base"
    for part in ("models", "protocols", "kv"):
        shutil.copytree(ROOT / part, base / part, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    out = tmp_path / "ab.json"
    subprocess.run([sys.executable, "-m", "bench.pi0.ab_checkouts", "--baseline", str(base), "--baseline-label", "copy",
                    "--device", "cpu", "--tiny", "--robots", "1", "2", "--rounds", "2", "--seconds", "0.2",
                    "--out", str(out)], cwd=ROOT, check=True, timeout=240, capture_output=True)
    report = json.loads(out.read_text())
    assert report["baseline"] == "copy" and report["device"] == "cpu"
    for label in ("this", "baseline"):
        assert report["workers"][label]["ready"]
        for n in ("1", "2"):
            assert len(report["rounds_p50_ms"][label][n]) == 2 and report["p50_ms"][label][n] > 0
    # The same seed and code: the same first answer.
    assert report["workers"]["this"]["actions_checksum"] == report["workers"]["baseline"]["actions_checksum"]
    assert set(report["ratio_this_over_baseline"]) == {"1", "2"}

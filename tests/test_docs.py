"""The README is a front door and the docs stand alone: bounded, and every link resolves in a clone.

Benchmark scripts and results are pruned over time (git keeps them), so the docs may name only
those still in the tree: a path under bench/, a ``bench.x.y`` module, and a result file named bare
(``pi0_h200.json``: a name with an underscore, looked up in bench/results/ or beside the doc).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
BENCH_PATH = re.compile(r"(?<![\w/.-])(?:\.\./)*(bench/[\w/.*-]+\.(?:py|sh|json))\b")
BENCH_MODULE = re.compile(r"(?<![\w./-])bench(?:\.\w+)+")
RESULT_NAME = re.compile(r"(?<![\w/.-])([A-Za-z0-9][\w-]*_[\w.-]*\.json)\b")
OUT_ARG = re.compile(r"--out\s+\S+")  # where a recorded command wrote: the file may since be renamed


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted(ROOT.glob("models/**/MODEL_CARD.md")), ROOT / "bench" / "README.md"]


def test_the_readme_is_short_with_two_set_up_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    assert max(len(line) for line in lines) <= 200
    commands = [line.strip() for line in lines if line.startswith("    make ")]
    assert commands == ["make serve", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for doc in _docs():
        if not doc.exists():
            continue
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() or ROOT not in path.parents:
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def _bench_names(text: str, beside: Path) -> list[str]:
    """What `text` (a doc in folder `beside`) names under bench/ that the tree lacks, as written."""
    text = OUT_ARG.sub("", text)
    missing = [p for p in BENCH_PATH.findall(text) if not any(ROOT.glob(p))]
    for module in BENCH_MODULE.findall(text):
        path = ROOT.joinpath(*module.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
            missing.append(module)
    missing += [name for name in RESULT_NAME.findall(text)
                if not (ROOT / "bench" / "results" / name).is_file() and not (beside / name).is_file()]
    return missing


def test_every_benchmark_script_module_and_result_named_exists():
    missing = []
    for doc in _docs():
        if doc.exists():
            missing += [f"{doc.relative_to(ROOT)}: {name}" for name in _bench_names(doc.read_text(), doc.parent)]
    assert missing == []


def test_the_benchmark_name_check_catches_a_pruned_name():
    text = ("`python -m bench.pi0.ab_checkouts`, `bench/pi0/profile_expert.py`, "
            "`bash bench/h100_gone.sh`, `bench/results/openpi_gpu_h200*.json`, "
            "`bench/results/gone.json`, tests/bench/test_docs.py, `python -m bench.docs`, "
            "[x](../../bench/results/pi0_h200.json), `--out bench/results/new.json`, "
            "`pi0_expert_profile_h200.json`, `pi0_h200_run0.json`, `world_session.json`, `config.json`, `_run2.json`")
    assert _bench_names(text, ROOT / "tests" / "e2e" / "golden") == [
        "bench/pi0/profile_expert.py", "bench/h100_gone.sh", "bench/results/gone.json",
        "bench.pi0.ab_checkouts", "pi0_h200_run0.json"]

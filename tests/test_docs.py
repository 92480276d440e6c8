"""The README is a front door and the docs stand alone: bounded, and every link resolves in a clone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


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

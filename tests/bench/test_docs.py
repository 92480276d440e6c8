"""bench/docs.py and bench/questions.py: the page matches the results, bench/results holds no
result that nothing reads, and the extractors read each layout the result files come in."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from bench.docs import PAGE, REPO, RESULTS, hardware, main, provenance, render_page, versions
from bench.questions import QUESTIONS, Question, Source, curve, fmt, maze_policy, world_serving

RESULT_NAME = re.compile(r"[\w*<>.-]*_[\w*<>.-]*\.json")  # x_h200.json, x_eval*.json, x_fleet_<cpu>.json
OUT_ARG = re.compile(r"--out\s+\S+")  # where a command writes is not evidence that the file is still needed
TEXT = {".md", ".py", ".sh", ".toml"}


def test_docs_benchmarks_md_is_what_the_results_say() -> None:
    assert main(["--check"]) == 0, "docs/benchmarks.md is out of date: run python -m bench.docs"


def cited_names(text: str) -> set[str]:
    """The result names ``text`` cites, as fnmatch patterns: ``<cpu>`` and ``*`` match any part."""
    return {re.sub(r"<[^>]*>", "*", name) for name in RESULT_NAME.findall(OUT_ARG.sub("", text))}


def test_cited_names_are_patterns_without_the_out_argument() -> None:
    text = ("`x_h200_run5.json`, bench/results/x_eval*.json, `x_eval_<candidate>.json`, "
            "--out bench/results/x_gone.json, `config.json`, bench/results/*.json")
    assert cited_names(text) == {"x_h200_run5.json", "x_eval*.json", "x_eval_*.json"}


def test_every_result_file_is_read_by_a_question_or_cited() -> None:
    """bench/results keeps the newest run of each question and what a doc, model card, comment or
    test cites as evidence; a run that nothing reads any more is deleted (git keeps it)."""
    patterns: set[str] = set()
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            path = Path(folder, name)
            if path.suffix in TEXT and path != PAGE:
                patterns |= cited_names(path.read_text(errors="replace"))
    read = {source.file for question in QUESTIONS for source in question.sources}
    unread = [path.name for path in sorted(RESULTS.glob("*.json")) if path.name not in read
              and not any(fnmatch.fnmatchcase(path.name, p) for p in patterns)]
    assert unread == []


def row(variant: str, n: int, total: float) -> dict:
    return {"variant": variant, "sessions": n, "frames_per_s_total": total, "frames_per_s_per_session_mean": total / n,
            "frames_per_s_per_session_min": total / n, "bare_frames_per_s_total": 100.0,
            "served_over_bare_throughput": total / 100.0, "tick_ms_p50": 7.0, "tick_ms_p99": 9.0,
            "engine_busy_share": 0.9}


def test_the_curve_is_the_first_variant_by_session_count_without_failed_rows() -> None:
    served = {"rows": [row("rgb8/auto", 32, 90.0), row("rgb8/auto", 1, 96.0), row("rgb8", 1, 95.0),
                       {"variant": "rgb8/auto", "sessions": 128, "error": "boom"}]}
    assert [(p["variant"], p["sessions"]) for p in curve(served)] == [("rgb8/auto", 1), ("rgb8/auto", 32)]
    assert [p["sessions"] for p in curve(served, "rgb8")] == [1]
    lines = world_serving(served)
    assert "| 1 | 96.0 (96.0) | 96 | 100 | 0.96 | 7.0 / 9.0 | 90% | - |" in lines
    assert "| `rgb8` | 1 | 95.0 | 0.95 | 90% |" in lines  # the other variant, below the curve
    assert not any("128" in line for line in lines)


def test_hardware_and_versions_from_each_layout() -> None:
    world = {"gpu": "NVIDIA H200", "cpu": "x86_64", "cpu_count": 16, "torch": "2.11", "python": "3.12"}
    assert hardware(world) == "NVIDIA H200; CPU: x86_64, 16 cores"
    assert versions(world) == "python 3.12, torch 2.11"
    kv = {"environment": {"cpu": "x86_64", "cpu_model": "Intel Xeon", "cpu_count": 16, "gpu": "NVIDIA H200",
                          "torch": "2.11", "triton": "3.6"}}
    assert hardware(kv) == "NVIDIA H200; CPU: Intel Xeon, 16 cores"
    assert versions(kv) == "torch 2.11, triton 3.6"
    tts = {"hardware": {"cpu": "AMD EPYC", "cpu_count": 2}, "versions": {"torch": "2.13", "piper-tts": None}}
    assert hardware(tts) == "CPU: AMD EPYC, 2 cores" and versions(tts) == "torch 2.13"
    assert hardware({"hardware": "NVIDIA H200"}) == "NVIDIA H200"
    assert hardware({}) == "not recorded" and versions({}) == "not recorded"


def test_provenance_names_the_file_the_date_and_the_command() -> None:
    lines = provenance("x.json", {"command": "python -m bench.x --out `y`", "date": "2026-12-01"})
    assert lines[0] == "- Result: `bench/results/x.json`, 2026-12-01"
    assert lines[-1] == "- Command: `` python -m bench.x --out `y` ``"
    assert provenance("x.json", {})[-1] == "- Command: not recorded"


def test_a_missing_figure_is_a_dash_not_a_failure() -> None:
    assert fmt(None) == "-" and fmt({"p50": 1}) == "-" and fmt(True) == "yes" and fmt(0.1234, ".2f") == "0.12"
    lines = maze_policy({"per_kind": {"wall": {"policy": {"success": 0.5}}}})
    assert "| wall | - | - | 50% | - |" in lines


def test_a_page_has_one_section_per_question_and_one_heading_per_labelled_source() -> None:
    files = {"a.json": {"n": 1, "runs": [{"n": 2}, {"n": 3}]}, "b.json": {"n": 4}}
    questions = [Question("Q", "What is n.", (Source("a.json", "first", select=lambda r: r["runs"][-1]),
                                              Source("b.json", "second")), lambda r: [f"n = {r['n']}"])]
    page = render_page(questions, files.__getitem__)
    assert page.count("## Q\n") == 1 and "### first\n\nn = 3\n" in page and "### second\n\nn = 4\n" in page

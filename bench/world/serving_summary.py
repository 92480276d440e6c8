"""Issue 19's goals beside the figures of one ``bench/h200_serving.sh`` run, and the README's curve.

    python -m bench.world.serving_summary world_serving_h200.json jpeg_paths_h200.json --out summary.json \
        [--profile engine_profile_h200.json] [--readme README.md]

Prints a short table (goal, figure, met) and the scaling curve as a Markdown table (also
written beside ``--out`` as ``scaling_curve.md``), with the capacity formula's prediction
under it. A missing row is reported as missing, never as met.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.report import emit

SERVED_OVER_BARE = 0.95
BUSY_SHARE = 0.95
TICK_P50_MS = 7.0
JPEG_OVER_RGB8 = 0.95
GOAL_SESSIONS = (1, 32, 128)
JPEG_SESSIONS = 32  # jpeg vs rgb8 (h200_serving.sh runs it there)
IDLE = ("runners.py:86(run)", "'acquire'", "'_acquire_restore'")


def _base(rows: list[dict[str, Any]], n: int, variant: str = "rgb8") -> dict[str, Any] | None:
    return next((r for r in rows if r.get("variant") == variant and r.get("sessions") == n and "error" not in r),
                None)


def goals(served: dict[str, Any], variant: str = "rgb8") -> list[dict[str, Any]]:
    """Every goal at ``variant``'s rows (the server as started: ``rgb8``, or e.g. ``rgb8/auto``)."""
    rows = served["rows"]
    out: list[dict[str, Any]] = []

    def goal(name: str, value: float | None, target: float, higher: bool = True) -> None:
        met = None if value is None else (value >= target if higher else value <= target)
        out.append({"goal": name, "target": f"{'>=' if higher else '<='} {target}", "value": value, "met": met})

    for n in GOAL_SESSIONS:
        r = _base(rows, n, variant)
        goal(f"served/bare throughput @{n}", r and r["served_over_bare_throughput"], SERVED_OVER_BARE)
        goal(f"engine busy share @{n}", r and r["engine_busy_share"], BUSY_SHARE)
    one = _base(rows, 1, variant)
    goal("single-session tick p50 ms", one and one["tick_ms_p50"], TICK_P50_MS, higher=False)
    for r in rows:  # the goal is at JPEG_SESSIONS; a dry run's smaller rows are compared alike
        if r.get("format") == "jpeg" and "error" not in r:
            base = _base(rows, r["sessions"], variant)
            ratio = base and r["frames_per_s_total"] / base["frames_per_s_total"]
            goal(f"{r['variant']}/rgb8 @{r['sessions']} (cuda path {r.get('cuda_frames_jpeg_path')})", ratio,
                 JPEG_OVER_RGB8)
    for r in rows:  # rgb8 with a mod (gil<MS>: another switch interval): the same goals, beside the default
        if r.get("format") == "rgb8" and r.get("variant") != variant and "error" not in r:
            goal(f"{r['variant']} served/bare throughput @{r['sessions']}", r["served_over_bare_throughput"],
                 SERVED_OVER_BARE)
            goal(f"{r['variant']} engine busy share @{r['sessions']}", r["engine_busy_share"], BUSY_SHARE)
    for r in rows:
        if "error" in r:
            out.append({"goal": f"row {r['variant']}@{r['sessions']}", "target": "runs", "value": r["error"],
                        "met": False})
    return out


def curve(served: dict[str, Any], variant: str = "rgb8") -> list[dict[str, Any]]:
    """``variant``'s rows by session count: what the README's table shows."""
    rows = sorted((r for r in served["rows"] if r.get("variant") == variant and "error" not in r),
                  key=lambda r: r["sessions"])
    return [{"sessions": r["sessions"], "fps_per_session": r["frames_per_s_per_session_mean"],
             "fps_per_session_min": r["frames_per_s_per_session_min"], "fps_total": r["frames_per_s_total"],
             "bare_fps_total": r["bare_frames_per_s_total"], "served_over_bare": r["served_over_bare_throughput"],
             "tick_ms_p50": r["tick_ms_p50"], "tick_ms_p99": r["tick_ms_p99"], "busy": r["engine_busy_share"],
             "gpu_used_gib": (r.get("gpu_memory") or {}).get("used_bytes", 0) / 2**30 or None} for r in rows]


def markdown(served: dict[str, Any], points: list[dict[str, Any]]) -> str:
    cap = served.get("capacity", {})
    mem = cap.get("memory") or {}
    lines = [f"{served.get('model')} on {served.get('gpu') or served.get('device')} through the real server "
             f"(`{served.get('command')}`):", "",
             "| sessions | frames/s per session (min) | frames/s total | bare total | served/bare "
             "| tick p50 / p99 ms | engine busy | GPU used GiB |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in points:
        gib = f"{p['gpu_used_gib']:.1f}" if p["gpu_used_gib"] else "-"
        lines.append(f"| {p['sessions']} | {p['fps_per_session']:.1f} ({p['fps_per_session_min']:.1f}) "
                     f"| {p['fps_total']:.0f} | {p['bare_fps_total']:.0f} | {p['served_over_bare']:.2f} "
                     f"| {p['tick_ms_p50']:.1f} / {p['tick_ms_p99']:.1f} | {p['busy']:.0%} | {gib} |")
    lines += ["", f"Capacity: the KV formula (kv.plan_capacity at {mem.get('fraction', '-')} of the free "
              f"memory) fits {mem.get('sessions', '-')} sessions; compute serves "
              f"{cap.get('compute_sessions_at_model_fps', float('nan')):.0f} at the model's "
              f"{cap.get('model_fps')} fps (bare frames/s / fps); measured: the slowest session first fell "
              f"below {cap.get('model_fps')} fps at {cap.get('measured_first_sessions_below_model_fps')} sessions "
              f"(tried up to {cap.get('measured_max_sessions_tried')})."]
    return "\n".join(lines) + "\n"


START, END = "<!-- scaling-curve:start -->", "<!-- scaling-curve:end -->"


def update_readme(text: str, table: str, result_file: str) -> str:
    """``text`` with the curve between the scaling-curve markers; without them, a new
    "Scaling" subsection goes right before "## More than one GPU" (or at the end)."""
    block = f"{START}\n{table}\nFrom `{result_file}`.\n{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        return head + block + rest.split(END, 1)[1]
    section = f"### Scaling on one GPU\n\n{block}\n\n"
    anchor = "## More than one GPU"
    return text.replace(anchor, section + anchor, 1) if anchor in text else text.rstrip("\n") + "\n\n" + section


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("served")
    parser.add_argument("jpeg", nargs="?")
    parser.add_argument("--profile", default=None, help="profile_engine.py's JSON: its top functions are shown")
    parser.add_argument("--out", default=None)
    parser.add_argument("--readme", default=None, help="put the curve into this README (between markers)")
    parser.add_argument("--variant", default="rgb8",
                        help="the rows the goals and the curve are read from (e.g. rgb8/auto)")
    args = parser.parse_args()
    served = json.loads(Path(args.served).read_text())
    jpeg = json.loads(Path(args.jpeg).read_text()) if args.jpeg and Path(args.jpeg).exists() else None
    checks, points = goals(served, args.variant), curve(served, args.variant)
    if not served.get("complete", True):
        print(f"INCOMPLETE run: {len(served['rows'])} rows written before it stopped")
    table = markdown(served, points)
    for c in checks:
        v = c["value"]
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        print(f"{'MET ' if c['met'] else 'MISS' if c['met'] is False else '----'} {c['goal']:<52} {shown:>10}  "
              f"({c['target']})")
    print(table, end="")
    paths = []
    for r in (jpeg or {}).get("rows", []):
        paths.append({k: r.get(k) for k in ("height", "width", "image", "batch", "pil_ms_per_frame",
                                             "pil_pool_ms_per_frame", "nvjpeg_batch_ms_per_frame",
                                             "nvjpeg_single_ms_per_frame", "fastest")})
        print("jpeg {height}x{width} {image}: PIL {pil_ms_per_frame:.3f} ms, pool {pool}, nvJPEG batch {nv} "
              "-> {fastest}".format(pool=_ms(r.get("pil_pool_ms_per_frame")), nv=_ms(r.get("nvjpeg_batch_ms_per_frame")),
                                    **r))
    print(f"CUDA frames' jpeg path picked in the run: {served.get('cuda_frames_jpeg')}")
    forced = {r["variant"]: r["frames_per_s_total"] for r in served["rows"]
              if r.get("variant") in ("jpeg/pil", "jpeg/nvjpeg") and "error" not in r}
    if len(forced) == 2:
        print(f"served jpeg frames/s total, each path forced: {forced} -> {max(forced, key=forced.get)} is faster")
    profile = json.loads(Path(args.profile).read_text()) if args.profile and Path(args.profile).exists() else None
    for name, thread in (profile or {}).get("threads", {}).items():
        # Waiting (the loop's selector, the engine's condition) is idle time, not work: left out.
        busy = [t for t in thread["top"] if not any(w in t["function"] for w in IDLE)]
        top = ", ".join(f"{t['function']} {t['own_share']:.1%}" for t in busy[:8])
        print(f"profile {name} ({thread['total_s']} s): {top}")
    report = {"goals": checks, "curve": points, "capacity": served.get("capacity"), "jpeg_paths": paths,
              "cuda_frames_jpeg": served.get("cuda_frames_jpeg"), "served_command": served.get("command"),
              "jpeg_command": (jpeg or {}).get("command")}
    emit(report, args.out, echo=False)
    if args.out:
        Path(args.out).with_name("scaling_curve.md").write_text(table)
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(update_readme(readme.read_text(), table, Path(args.served).name))


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


if __name__ == "__main__":
    main()

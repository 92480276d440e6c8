"""The questions docs/benchmarks.md answers, each with its result files and one extractor.

An extractor takes one result (a parsed bench/results JSON) and returns Markdown lines. The
files come in a few layouts, written by different benchmarks over time; extractors read with
``dig`` and ``fmt`` so a missing figure shows as ``-`` instead of failing the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

Result = dict[str, Any]


Render = Callable[[Result], list[str]]


@dataclass(frozen=True)
class Source:
    """One result file of a question: a heading when the question has several, ``select`` when
    the figures sit inside the file (e.g. its last run), ``render`` when it is not the question's."""

    file: str
    label: str = ""
    select: Callable[[Result], Result] | None = None
    render: Render | None = None


@dataclass(frozen=True)
class Question:
    title: str
    about: str  # what is asked, and the goal where the question fixes one
    sources: tuple[Source, ...]
    render: Render


# ------------------------------------------------------------------ reading and formatting
def dig(result: Any, *path: Any) -> Any:
    """``result[path[0]][path[1]]...`` (keys as ints or their strs; list indexes), or None."""
    for key in path:
        if isinstance(result, dict):
            result = result.get(key, result.get(str(key)))
        elif isinstance(result, list) and isinstance(key, int) and -len(result) <= key < len(result):
            result = result[key]
        else:
            return None
    return result


def fmt(value: Any, spec: str = ".1f", unit: str = "") -> str:
    """``value`` formatted, or ``-`` when the file does not record it."""
    if value is None or isinstance(value, (dict, list)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:{spec}}{unit}"
    return f"{value}{unit}"


def pct(value: Any) -> str:
    return fmt(value, ".0%") if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table; the first column left-aligned, the rest right-aligned."""
    if not rows:
        return ["(no rows recorded)"]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def code(text: str) -> str:
    """Inline code that survives backticks inside."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def by_count(section: Any) -> list[tuple[int, Any]]:
    """``{"1": x, "8": y, ...}`` as ``[(1, x), (8, y), ...]``, numeric keys only, in order."""
    if not isinstance(section, dict):
        return []
    return sorted((int(k), v) for k, v in section.items() if str(k).isdigit())


# ------------------------------------------------------------------ (a) world serving on one GPU
def curve(result: Result, variant: str | None = None) -> list[Result]:
    """The rows of ``variant`` (default: the run's first, the server as started) by session count."""
    rows = [r for r in result.get("rows", []) if "error" not in r]
    variant = variant if variant is not None else (rows[0].get("variant") if rows else None)
    return sorted((r for r in rows if r.get("variant") == variant), key=lambda r: r["sessions"])


def world_serving(result: Result) -> list[str]:
    points = curve(result)
    variant = points[0].get("variant") if points else "-"
    out = [f"`{result.get('model')}` on {result.get('gpu') or result.get('device')}, the server as started "
           f"(variant `{variant}`), against the bare model at the same batch in the same run:", ""]
    out += table(["sessions", "frames/s per session (slowest)", "frames/s total", "bare total", "served/bare",
                  "tick p50 / p99 ms", "engine busy", "GPU used GiB"],
                 [[str(p["sessions"]),
                   f"{fmt(p.get('frames_per_s_per_session_mean'))} ({fmt(p.get('frames_per_s_per_session_min'))})",
                   fmt(p.get("frames_per_s_total"), ".0f"), fmt(p.get("bare_frames_per_s_total"), ".0f"),
                   fmt(p.get("served_over_bare_throughput"), ".2f"),
                   f"{fmt(p.get('tick_ms_p50'))} / {fmt(p.get('tick_ms_p99'))}", pct(p.get("engine_busy_share")),
                   fmt((dig(p, "gpu_memory", "used_bytes") or 0) / 2**30 or None)] for p in points])
    cap = result.get("capacity") or {}
    if cap:
        out += ["", f"Capacity: the KV formula fits {fmt(dig(cap, 'memory', 'sessions'), 'd')} sessions at "
                f"{fmt(dig(cap, 'memory', 'fraction'), '.2f')} of free memory; compute serves "
                f"{fmt(cap.get('compute_sessions_at_model_fps'), '.0f')} at the model's {fmt(cap.get('model_fps'))} "
                f"frames/s; the slowest session first fell below that at "
                f"{fmt(cap.get('measured_first_sessions_below_model_fps'), 'd')} sessions (tried up to "
                f"{fmt(cap.get('measured_max_sessions_tried'), 'd')})."]
    others = [r for r in result.get("rows", []) if r.get("variant") != variant and "error" not in r]
    if others:
        out += ["", "Other variants in the same run:", ""]
        out += table(["variant", "sessions", "frames/s per session", "served/bare", "engine busy"],
                     [[f"`{r.get('variant')}`", str(r.get("sessions")), fmt(r.get("frames_per_s_per_session_mean")),
                       fmt(r.get("served_over_bare_throughput"), ".2f"), pct(r.get("engine_busy_share"))]
                      for r in others])
    return out


WORLD_GOAL = ("Goal: served/bare throughput >= 0.95 and the engine busy >= 95% of the time at 1, 32 and 128 "
              "sessions; one session's tick p50 <= 7 ms.")


# ------------------------------------------------------------------ (b) the maze world on 2 CPU cores
def maze_cpu(result: Result) -> list[str]:
    models = dig(result, "servers", 0, "served_models", "data") or []
    maze = next((m for m in models if m.get("name") == "maze"), {})
    out = [f"The maze world as `realtime serve` starts it on CPU ({fmt(maze.get('dtype'))}, "
           f"{fmt(maze.get('denoising_steps'), 'd')} denoising steps, a {fmt(maze.get('window_frames'), 'd')}-frame "
           f"window), {fmt(result.get('format'))} frames, {fmt(result.get('cpu_count'), 'd')} cores:", ""]
    rows = []
    for variant, by_n in (result.get("summary") or {}).items():
        for n, s in by_count(by_n):
            bare = s.get("bare_frames_per_s_per_session") or []
            drawn = s.get("page_frames_drawn_per_s")
            rows.append([f"{variant} @ {n}", fmt(s.get("served_frames_per_s_per_session_min")),
                         " / ".join(fmt(b) for b in bare) or "-", fmt(s.get("served_over_bare_mean"), ".2f"),
                         f"{fmt(s.get('served_cpu_ms_per_frame'), '.0f')} / {fmt(s.get('bare_cpu_ms_per_frame'), '.0f')}",
                         "-" if drawn is None else f"{fmt(drawn)} ({fmt(s.get('page_stalls'), 'd')} stalls)"])
    out += table(["variant @ sessions", "served frames/s per session (slowest)", "bare frames/s (before / after)",
                  "served/bare", "CPU ms per frame served / bare", "demo page frames drawn/s"], rows)
    if result.get("notes"):
        out += ["", f"Conditions: {result['notes']}."]
    return out


# ------------------------------------------------------------------ (c) maze world quality
def maze_quality(result: Result) -> list[str]:
    one = result.get("one_step") or {}
    out = [f"One-step PSNR on frames that change: **{fmt(one.get('model_db'))} dB** (copying the last frame: "
           f"{fmt(one.get('copy_db'))} dB; {fmt(one.get('frames_changed'), 'd')} of {fmt(one.get('frames'), 'd')} "
           "frames change).", "", "Rollouts (PSNR on changing frames, dB):", ""]
    out += table(["frames ahead", "model", "copy last frame"],
                 [[str(h), fmt(r.get("model_db")), fmt(r.get("copy_db"))] for h, r in by_count(result.get("rollout"))])
    act, inv, nokey, wall = (result.get(k) or {} for k in ("action_following", "inverse_dynamics", "no_key", "wall"))
    out += ["", f"- Action following: a J turn's frame is closer to J's truth than to L's in "
            f"{pct(dig(act, 'turn_j_vs_l', 'closer_to_own'))} of cases; W vs S in {pct(dig(act, 'move_w_vs_s', 'closer_to_own'))}.",
            f"- Inverse dynamics on generated frames: {pct(inv.get('ratio'))} of its accuracy on real frames.",
            f"- No key held for {fmt(nokey.get('frames'), 'd')} frames: {fmt(nokey.get('mean_db'))} dB against the "
            f"still view on average (the worst frame's mean {fmt(nokey.get('min_over_frames_of_mean_db'))} dB).",
            f"- Walking into a wall: {fmt(wall.get('mean_db_vs_frozen_truth'))} dB against the frozen view.", ""]
    gates = result.get("gates") or {}
    out += table(["gate", "met"], [[name, fmt(met)] for name, met in gates.items()])
    return out


# ------------------------------------------------------------------ (d) maze navigation policy
def maze_policy(result: Result) -> list[str]:
    rows = [[kind, pct(dig(k, "planner", "success")), pct(dig(k, "random", "success")),
             pct(dig(k, "policy", "success")), fmt(k.get("policy_vs_planner"), ".2f")]
            for kind, k in (result.get("per_kind") or {}).items()]
    out = table(["goal kind", "planner (knows the map)", "random keys", "policy", "policy / planner"], rows)
    return out + ["", f"{fmt(result.get('mazes_per_kind'), 'd')} unseen mazes per kind, "
                  f"{fmt(result.get('budget_frames'), 'd')} frames each; policy / planner mean "
                  f"**{fmt(result.get('policy_vs_planner_mean'), '.3f')}** (goal {fmt(result.get('goal'))})."]


# ------------------------------------------------------------------ (e) LingBot-World 14B
def lingbot(result: Result) -> list[str]:
    bare, served, idle = (result.get("bare") or {}), (result.get("served") or {}), dig(result, "ttff", "idle_summary") or {}
    kv, steady = (result.get("kv") or {}), dig(result, "swap", "steady") or {}
    model = result.get("model") or {}
    return [f"Random weights at full size ({fmt(model.get('transformer_params'), ',d')} transformer parameters, "
            f"{fmt(model.get('height'), 'd')}x{fmt(model.get('width'), 'd')}, {fmt(model.get('passes_per_tick'), 'd')} "
            f"passes a tick).", "",
            f"- One tick bare: {fmt(bare.get('tick_ms_median'), '.0f')} ms (transformer "
            f"{fmt(dig(bare, 'phases', 'transformer_ms_median'), '.0f')} ms, VAE decode "
            f"{fmt(dig(bare, 'phases', 'decode_ms_median'), '.0f')} ms).",
            f"- Served over world.v1: a chunk every {fmt(served.get('chunk_period_ms_median'), '.0f')} ms, "
            f"**{fmt(served.get('served_over_bare'), '.3f')}x** bare (goal: {fmt(served.get('goal'))}).",
            f"- Key press to first frame, idle session: {fmt(idle.get('ttff_ms_median'), '.0f')} ms (goal: "
            f"{fmt(idle.get('goal'))} = {fmt(idle.get('goal_ms'), '.0f')} ms; met: {fmt(idle.get('within_goal'))}).",
            f"- KV per session: {fmt(kv.get('session_gib'), '.2f')} GiB, equal to the capacity formula to the byte: "
            f"{fmt(kv.get('equal_to_the_byte'))}; sessions that fit at 0.9 of memory: "
            f"{fmt(dig(result, 'capacity', 'sessions_at_fraction_0_9'), 'd')}.",
            f"- Swap of a whole session, steady: out {fmt(steady.get('swap_out_GBps'))} GB/s, in "
            f"{fmt(steady.get('swap_in_GBps'))} GB/s (pinned copy {fmt(steady.get('d2h_GBps'))} / "
            f"{fmt(steady.get('h2d_GBps'))} GB/s)."]


def lingbot_ab(result: Result) -> list[str]:
    """Each opt-in shortcut against the exact path, measured in the same run."""
    variants = dig(result, "ab", "variants") or {}
    exact = dig(variants, "exact", "steady_chunk_ms")
    rows = []
    for name, v in variants.items():
        chunk = v.get("steady_chunk_ms")
        ratio = chunk / exact if isinstance(chunk, (int, float)) and exact else None
        fps = 12000 / chunk if isinstance(chunk, (int, float)) and chunk else None
        rows.append([name, fmt(v.get("passes_per_chunk"), "d"), fmt(chunk, ".0f"), fmt(v.get("steady_transformer_ms"), ".0f"),
                     fmt(ratio, ".3f"), fmt(fps, ".1f"), fmt(v.get("latent_max_abs_err"), ".3g")])
    check = dig(result, "ab", "fp8_kernel_check") or {}
    out = table(["options", "passes", "chunk ms", "transformer ms", "chunk / exact", "frames/s (12 a chunk)",
                 "latent max error"], rows)
    return out + ["", "Random weights: the error columns say how far a shortcut moves the latents, not how the "
                  "pictures look. FP8 kernel alone on one FFN linear "
                  f"({fmt(check.get('tokens'), 'd')} tokens): bf16 {fmt(check.get('bf16_ms'), '.3f')} ms, "
                  f"scaled_mm {fmt(check.get('scaled_mm_ms'), '.3f')} ms."]


# ------------------------------------------------------------------ (f) pi0
def pi0(result: Result) -> list[str]:
    goals, model = (result.get("goals") or {}), (result.get("model") or {})
    rows = []
    for n, served in by_count(result.get("served")):
        rows.append([str(n), fmt(dig(result, "bare", n, "call_ms", "p50")),
                     fmt(dig(served, "batched", "latency_ms", "p50")), fmt(dig(served, "batched", "calls_per_s")),
                     fmt(dig(served, "one_at_a_time", "calls_per_s")), fmt(served.get("speedup"), ".2f")])
    out = [f"{fmt(model.get('config'))}, {fmt(model.get('weights'))}, {fmt(model.get('dtype'))}; one call = "
           f"{fmt(model.get('steps'), 'd')} flow steps for a {'x'.join(map(str, model.get('chunk') or ['-']))} action chunk.", ""]
    out += table(["robots", "bare p50 ms", "served p50 ms", "served calls/s", "one-at-a-time calls/s",
                  "batched / one-at-a-time"], rows)
    return out + ["", f"Goals: one robot served p50 {fmt(goals.get('one_robot_served_p50_ms'))} ms (goal <= "
                  f"{fmt(goals.get('goal_one_robot_ms'))}); served/bare {fmt(goals.get('served_over_bare'), '.3f')} "
                  f"(goal <= {fmt(goals.get('goal_ratio'))}); batching speed-up at 8 / 32 robots "
                  f"{fmt(goals.get('speedup_8'), '.2f')} / {fmt(goals.get('speedup_32'), '.2f')} (goal "
                  f"{fmt(goals.get('goal_speedup'))})."]


# ------------------------------------------------------------------ (g) OpenPI
def openpi_fleet(result: Result) -> list[str]:
    rows = [[str(n), fmt(dig(r, "ours", "calls_per_s"), ".0f"), fmt(dig(r, "reference", "calls_per_s"), ".0f"),
             fmt(r.get("ratio_calls_per_s_ours_over_reference"), ".2f"),
             fmt(r.get("ratio_p50_ours_over_reference"), ".2f"), fmt(r.get("ratio_p99_ours_over_reference"), ".2f")]
            for n, r in by_count(result.get("results"))]
    out = [f"Policy: {fmt(result.get('policy'))}; clients: {fmt(result.get('clients'))}; "
           f"{fmt(result.get('rounds'), 'd')} interleaved rounds.", ""]
    out += table(["robots", "ours calls/s", "reference calls/s", "ours / reference", "p50 latency ours / ref",
                  "p99 latency ours / ref"], rows)
    goals = result.get("goals") or {}
    if goals:
        met = [(k.split("_")[-2], v) for k, v in goals.items()]  # calls_per_s_at_least_reference_<n>_clients
        out += ["", "Goal, calls/s at least the reference's; met at "
                + ", ".join(f"{n} robot{'' if n == '1' else 's'}: {fmt(v)}" for n, v in met) + "."]
    return out


def openpi_gpu(result: Result) -> list[str]:
    policy = result.get("policy") or {}
    rows = []
    for n, r in by_count(dig(result, "results", "batched")):
        alone = dig(result, "results", "one-at-a-time", n) or {}
        rows.append([str(n), fmt(dig(result, "bare_forward_ms", n, "p50")), fmt(r.get("calls_per_s"), ".0f"),
                     fmt(dig(r, "latency_ms", "p50")), fmt(alone.get("calls_per_s"), ".0f"),
                     fmt(dig(result, "speedup_calls_per_s_over_one_at_a_time", "batched", n), ".2f")])
    out = [f"`{fmt(policy.get('name'))}` ({fmt(policy.get('parameters'), ',d')} parameters) in the engine, "
           "robots over the OpenPI protocol:", ""]
    return out + table(["robots", "bare forward p50 ms", "batched calls/s", "batched p50 ms",
                        "one-at-a-time calls/s", "speed-up"], rows)


# ------------------------------------------------------------------ (h) speech
def tts_served(result: Result) -> list[str]:
    ttfa = result.get("ttfa_ms") or {}
    names = {"served": "served (default)", "served_float32": "served, float32", "adapter": "the voice alone"}
    rows = [[label, fmt(dig(ttfa, key, "p50")), fmt(dig(ttfa, key, "p90")), fmt(dig(ttfa, key, "p99"))]
            for key, label in names.items() if key in ttfa]
    out = [f"{fmt(result.get('utterances'), 'd')} utterances, measurements interleaved; first audio in ms:", ""]
    out += table(["path", "p50", "p90", "p99"], rows)
    goal = result.get("goal") or {}
    if goal:
        out += ["", f"Goal: served p50 <= {fmt(goal.get('served_ttfa_p50_ms_le'))} ms; met: {fmt(goal.get('met'))}."]
    return out + ([f"Conditions: {result['box']}."] if result.get("box") else [])


def tts_gpu(result: Result) -> list[str]:
    rows = [[mode, fmt(dig(r, "ttfa_ms", "p50")), fmt(dig(r, "ttfa_ms", "p99")), fmt(r.get("x_realtime")),
             fmt(r.get("worst_stall_ms"))] for mode, r in (result.get("results") or {}).items()]
    out = [f"{fmt(result.get('sessions'), 'd')} sessions, each given a paragraph at once:", ""]
    out += table(["schedule", "first audio p50 ms", "p99 ms", "x real time", "worst stall ms"], rows)
    goals = result.get("goals") or {}
    return out + ["", "Goal, first audio p99 <= 100 ms (batched): met: "
                  f"{fmt(goals.get('ttfa_p99_ms_le_100'))}."] if goals else out


def last_run(result: Result) -> Result:
    return (result.get("runs") or [result])[-1]


def tts_beside_world(result: Result) -> list[str]:
    ttfa = result.get("ttfa_ms") or {}
    return [f"{fmt(ttfa.get('n'), 'd')} utterances while a maze world session streams: first audio p50 / p90 / p99 "
            f"{fmt(ttfa.get('p50'))} / {fmt(ttfa.get('p90'))} / {fmt(ttfa.get('p99'))} ms; worst stall inside an "
            f"utterance {fmt(result.get('worst_stall_ms'))} ms; the world meanwhile at "
            f"{fmt(result.get('world_frames_per_s'))} frames/s."]


# ------------------------------------------------------------------ (i) KV, attention, VAE decode
def kv_gpu(result: Result) -> list[str]:
    rows = []
    for case, r in (result.get("results") or {}).items():
        if case.startswith("attention_"):
            rows.append([case.removeprefix("attention_"), fmt(r.get("batch"), "d"), fmt(r.get("keys_per_row"), "d"),
                         fmt(r.get("speed_vs_sdpa"), ".2f"), fmt(r.get("graph_speed_vs_sdpa"), ".2f"),
                         fmt(r.get("graph_paged_best"))])
    out = ["Paged attention against contiguous SDPA (higher is faster):", ""]
    out += table(["case", "batch", "keys per row", "eager (auto)", "in a CUDA graph", "best in a graph"], rows)
    swap = dig(result, "results", "swap_lingbot_session") or {}
    goals = result.get("goals") or {}
    out += ["", f"Swap-out + swap-in of a {fmt(swap.get('session_GiB'))} GiB session: "
            f"{fmt(swap.get('steady_time_vs_bandwidth'), '.2f')}x the pinned copy time, bit-exact: "
            f"{fmt(swap.get('bit_exact'))}."]
    if goals:
        out += ["Goals: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in goals.items()) + "."]
    return out


def kv_triton(result: Result) -> list[str]:
    rows = []
    for case, r in (result.get("times") or {}).items():
        rows.append([case, fmt(dig(r, "triton", "speed_vs_sdpa_graph"), ".2f"),
                     fmt(dig(r, "gather_sdpa", "speed_vs_sdpa_graph"), ".2f"),
                     fmt(dig(result, "errors", case, "triton_default", "rel_err"), ".4f"),
                     fmt(dig(result, "errors", case, "sdpa_bfloat16", "rel_err"), ".4f")])
    out = ["The Triton paged kernel in a CUDA graph, as the maze frame path runs it, against contiguous SDPA:", ""]
    out += table(["case", "Triton vs SDPA", "gather + SDPA vs SDPA", "Triton rel. error", "SDPA bf16 rel. error"],
                 rows)
    return out + ["", f"All checks passed: {fmt(result.get('ok'))}."]


def kv_bookkeeping(result: Result) -> list[str]:
    rows = [[name, fmt(r.get("device")), fmt(r.get("sessions"), "d"), fmt(r.get("reorder")),
             fmt(r.get("per_tick_median_ms"), ".3f"), fmt(r.get("per_tick_p90_ms"), ".3f")]
            for name, r in (result.get("results") or {}).items() if name.startswith("bookkeeping")]
    out = table(["case", "device", "sessions", "new order every tick", "ms per tick p50", "p90"], rows)
    goal = dig(result, "goals", "bookkeeping_ms_per_tick_128_sessions")
    return out + ([f"", f"Goal: {goal} ms per tick for 128 sessions."] if goal else [])


def wan_vae(result: Result) -> list[str]:
    rows = [["one shot", fmt(dig(result, "one_shot", "marginal_ms_per_frame")), "-", "-"]]
    for mode, r in (result.get("streaming") or {}).items():
        rows.append([f"streaming, {mode.replace('_', ' ')}", fmt(dig(r, "frames", "marginal_ms_per_frame")),
                     fmt(r.get("steady_block_first_frame_ms")), fmt(r.get("state_mib"), ".0f")])
    out = [f"{fmt(result.get('config'))}, {fmt(result.get('dtype'))}, {fmt(result.get('height'), 'd')}x"
           f"{fmt(result.get('width'), 'd')}, blocks of {fmt(result.get('block'), 'd')} latent frames:", ""]
    out += table(["decode", "ms per frame (marginal)", "a block's first frame ms", "state MiB"], rows)
    return out + (["", f"Goal: {result['goal']}."] if result.get("goal") else [])


# ------------------------------------------------------------------ (j)-(l) soak, replicas, fuzzing
def soak(result: Result) -> list[str]:
    counts, rss = (result.get("counts") or {}), (result.get("rss_mb") or {})
    sessions = ", ".join(f"{v} {k}" for k, v in (result.get("sessions") or {}).items())
    return [f"{fmt(result.get('seconds'), '.0f')} s with {sessions} sessions"
            + (f" ({result['note']})" if result.get("note") else "")
            + ": " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in counts.items() if isinstance(v, int)) + ".",
            "",
            f"- Failed requests {fmt(result.get('failed_requests'), 'd')}, chunk gaps {len(result.get('chunk_gaps', []))}, "
            f"lost events {len(result.get('lost_events', []))}, KV blocks left {fmt(result.get('kv_blocks_used_at_end'), '.0f')}, "
            f"log problems {len(result.get('log_problems', []))}; passed: {fmt(result.get('ok'))}.",
            f"- Server RSS {fmt(rss.get('start'), '.0f')} -> {fmt(rss.get('end'), '.0f')} MB; slope after warm-up "
            f"{fmt(rss.get('slope_after_warmup_mb_per_min'), '.2f')} MB/min."]


def replicas(result: Result) -> list[str]:
    rows = [[fmt(r.get("replicas"), "d"), fmt(r.get("sessions"), "d"), fmt(r.get("direct_frames_per_s_total_median")),
             fmt(r.get("nginx_frames_per_s_total_median")), fmt(r.get("nginx_over_direct"), ".2f")]
            for r in result.get("rows", [])]
    out = [f"`{fmt(result.get('model'))}` world replicas on {fmt(result.get('device'))}, frames/s in total (median of rounds):", ""]
    out += table(["replicas", "sessions", "direct", "through nginx", "nginx / direct"], rows)
    lat = result.get("latency_one_session_one_replica") or {}
    out += ["", f"nginx's added latency per chunk, paired median: {fmt(lat.get('proxy_added_ms_paired_median'), '.2f')} ms."]
    return out + ([f"Conditions: {result['caveat']}."] if result.get("caveat") else [])


def h264_maze(result: Result) -> list[str]:
    jpeg, preset = result.get("jpeg") or {}, result.get("server_preset")
    rows = [["jpeg q" + fmt(jpeg.get("quality"), "d"), jpeg]] + [
        [f"h264 {p}" + (" (the server's)" if p == preset else ""), r] for p, r in (result.get("h264") or {}).items()]
    if result.get("h264_main"):
        rows.append([f"h264 {preset}, main profile", result["h264_main"]])
    out = [f"{fmt(result.get('frames'), 'd')} rendered maze frames at {fmt(result.get('height'), 'd')}x"
           f"{fmt(result.get('width'), 'd')} ({fmt(result.get('fps'), '.0f')} frames/s, walking and turning), h264 at "
           f"{fmt(dig(result, 'h264', preset, 'bitrate_kbps'), 'd')} kbit/s; the encoder pinned to one core:", ""]
    out += table(["codec", "bytes/frame (first)", "kbit/s", "PSNR dB mean (worst)", "SSIM mean (worst)",
                  "encode ms/frame p50 wall / CPU"],
                 [[name, f"{fmt(r.get('bytes_per_frame_mean'), '.0f')} ({fmt(r.get('bytes_first_frame'), 'd')})",
                   fmt(r.get("kbit_per_s"), ".0f"), f"{fmt(r.get('psnr_db_mean'), '.2f')} ({fmt(r.get('psnr_db_min'), '.2f')})",
                   f"{fmt(r.get('ssim_mean'), '.4f')} ({fmt(r.get('ssim_min'), '.4f')})",
                   f"{fmt(r.get('encode_ms_per_frame_median'), '.2f')} / {fmt(r.get('encode_cpu_ms_per_frame_median'), '.2f')}"]
                  for name, r in rows])
    g, sessions = result.get("goals") or {}, result.get("sessions") or {}
    out += ["", f"h264/jpeg bytes a frame: **{fmt(g.get('bytes_per_frame_h264_over_jpeg'), '.3f')}** (within 1/5: "
            f"{fmt(g.get('bytes_within_goal'))}; PSNR at least jpeg's: {fmt(g.get('psnr_at_least_jpeg'))}); encoder "
            f"within 8 ms a frame on one core: wall {fmt(g.get('encode_ms_within_goal'))}, CPU "
            f"{fmt(g.get('encode_cpu_ms_within_goal'))}. {fmt(sessions.get('sessions'), 'd')} streams at once on "
            f"{fmt(sessions.get('cores'), 'd')} cores: the slowest at {fmt(sessions.get('frames_per_s_per_session_min'), '.0f')} "
            f"frames/s (16 needed). Load average during the run: {fmt(dig(result, 'load_average_at_start', 0), '.1f')} "
            f"at the start, {fmt(dig(result, 'load_average_at_end', 0), '.1f')} at the end."]
    trip = result.get("yuv420_round_trip")
    if trip:
        out += ["", f"The colour conversions alone (RGB -> yuv420p -> RGB, FFmpeg's swscale, no codec): "
                f"{fmt(trip.get('psnr_db_mean'), '.2f')} dB, SSIM {fmt(trip.get('ssim_mean'), '.4f')}: the most PSNR an "
                "h264 stream decoded this way can have."]
    return out


def page_latency(result: Result) -> list[str]:
    formats, g = result.get("formats") or {}, result.get("goal") or {}
    rows = [[f, fmt(r.get("median_ms")), fmt(r.get("p90_ms")), fmt(r.get("max_ms")), fmt(r.get("n"), "d"),
             fmt(r.get("missed"), "d"), fmt(r.get("rtt_median_ms")), fmt(r.get("queued_at_key_median"), ".0f"),
             fmt(r.get("frames_drawn_per_s_median")), fmt(r.get("stalls"), "d")] for f, r in formats.items()]
    out = [f"`{fmt(result.get('world'))}` at {fmt(result.get('height'), 'd')}x{fmt(result.get('width'), 'd')} "
           f"({fmt(result.get('fps'), '.0f')} frames/s) through `realtime serve` on CPU, the page in headless Chromium; "
           f"a turn key pressed on a still picture, in blocks of {fmt(result.get('block'), 'd')} presses, the formats "
           "alternating. Key press to the first canvas paint that differs, ms (the page's clock):", ""]
    out += table(["format", "median", "p90", "max", "N", "missed", "event round trip (median)",
                  "chunks queued at the press (median)", "frames/s drawn", "stalls"], rows)
    return out + ["", f"h264 - jpeg, medians: **{fmt(g.get('h264_minus_jpeg_median_ms'))} ms** = "
                  f"{fmt(g.get('h264_minus_jpeg_median_frames'), '.2f')} frames of "
                  f"{fmt(g.get('frame_interval_ms'))} ms; within one frame: {fmt(g.get('within_one_frame'))}. "
                  f"Load average during the run: {fmt(dig(result, 'load_average_at_start', 0), '.1f')} at the start, "
                  f"{fmt(dig(result, 'load_average_at_end', 0), '.1f')} at the end."]


def fuzz(result: Result) -> list[str]:
    protocols = list(dict.fromkeys([*(result.get("decoders") or {}), *(result.get("live") or {})]))
    rows = [[p, fmt(dig(result, "decoders", p, "cases"), ",d"), fmt(dig(result, "decoders", p, "crashes"), "d"),
             fmt(dig(result, "live", p, "cases"), ",d"), fmt(dig(result, "live", p, "crashes"), "d")] for p in protocols]
    out = table(["protocol", "decoder cases", "crashes", "live cases", "crashes"], rows)
    server = result.get("server") or {}
    return out + ["", f"Server log problems after the live run: {fmt(server.get('log_problems'), 'd')} "
                  f"({fmt(server.get('log_lines'), ',d')} lines); still healthy: {fmt(server.get('healthz'))}. "
                  "Goal: no crash and no log problem."]


def restructure_ab(result: Result) -> list[str]:
    base, head = dig(result, "world", "base") or [], dig(result, "world", "head") or []
    rows = []
    for b, h in zip(base, head):
        ratio = (h.get("frames_per_s_total") or 0) / (b.get("frames_per_s_total") or 1)
        rows.append([str(h.get("sessions")), fmt(b.get("frames_per_s_total"), ".0f"), fmt(h.get("frames_per_s_total"), ".0f"),
                     fmt(ratio, ".3f"), fmt(b.get("served_over_bare_throughput"), ".3f"),
                     fmt(h.get("served_over_bare_throughput"), ".3f")])
    out = [f"On {dig(result, 'hardware', 'gpu')}, the base commit `{result.get('base_commit')}` and this tree back to "
           "back (maze world, `rgb8/auto`):", ""]
    out += table(["sessions", "base frames/s", "head frames/s", "head/base", "base served/bare", "head served/bare"], rows)
    pb, ph = dig(result, "pi0_one_robot", "base") or {}, dig(result, "pi0_one_robot", "head") or {}
    out += ["", f"π0, one robot served p50: base {fmt(pb.get('served_p50_ms'), '.2f')} ms, head "
            f"{fmt(ph.get('served_p50_ms'), '.2f')} ms (bare {fmt(ph.get('bare_p50_ms'), '.2f')} ms). Goal: within 3%."]
    return out


QUESTIONS: tuple[Question, ...] = (
    Question("World serving on one GPU: the scaling curve",
             "How many maze world sessions one GPU serves through the real server, and what serving costs against "
             "the bare model, from 1 to 256 sessions. " + WORLD_GOAL,
             (Source("world_serving_curve_h200.json"),), world_serving),
    Question("World serving on one GPU: re-check",
             "The curve's 1, 32 and 256 points measured again on the newest code. " + WORLD_GOAL,
             (Source("world_serving_recheck_h200.json"),), world_serving),
    Question("Serving after the restructuring by role",
             "The server split into engine, endpoints and server with one session lifecycle and one encoder, "
             "against the commit before it, in one run: maze world serving at 1, 32 and 128 sessions, and π0's "
             "one-robot latency.",
             (Source("restructure_ab_h200.json"),), restructure_ab),
    Question("The maze world served on 2 CPU cores",
             "The default `realtime serve` on two CPU cores, through world.v1 and the demo page, against the bare "
             "model; one row per CPU kind.",
             (Source("maze_serve_cpu_amx_ahead.json", "Intel Xeon, Sapphire Rapids with AMX"),
              Source("maze_serve_cpu_epyc_zen3.json", "AMD EPYC, AVX2")), maze_cpu),
    Question("Maze world quality",
             "How well the shipped maze world model predicts 256 unseen mazes, against copying the last frame, "
             "and whether it follows keys, holds still and stops at walls; each gate is the model's release bar.",
             (Source("maze_eval.json"),), maze_quality),
    Question("Maze navigation policy",
             "How often the shipped policy reaches the named goal in unseen mazes, against a planner that knows the "
             "map and against random keys.",
             (Source("maze_policy_eval_h200_run8.json"),), maze_policy),
    Question("LingBot-World 14B",
             "LingBot-World at its full geometry on one GPU: a served tick against the bare one, key press to first "
             "frame, KV bytes against the capacity formula, and swapping a session out and in.",
             (Source("lingbot_h200.json"),), lingbot),
    Question("LingBot-World: the opt-in shortcuts",
             "Each shortcut of the lingbot entry (fewer denoising steps, reusing the last step's K/V instead of the "
             "committing pass, FP8 linears, the TAEHV decoder) against the exact path in one run, 8 chunks each at "
             "480x832; then the fastest set served over world.v1 beside the exact path served. Goal: 10 frames/s "
             "for one session on one GPU.",
             (Source("lingbot_ab_h100.json", "Each shortcut against the exact path", render=lingbot_ab),
              Source("lingbot_shortcuts_h100.json", "Served with steps=1, reuse_kv=1, TAEHV"),
              Source("lingbot_exact_served_h100.json", "Served on the exact path")), lingbot),
    Question("π0 on one GPU",
             "π0 at full size (random weights) served over OpenPI against calling the model directly, one robot and "
             "batches of robots.",
             (Source("pi0_h200.json"),), pi0),
    Question("OpenPI: robot fleets against openpi's reference server",
             "Calls/s and latency of 1, 4 and 16 robots (the real `openpi-client`, an instant policy) against our "
             "server and a restatement of openpi's `WebsocketPolicyServer`, on 2 CPU cores; one row per CPU kind.",
             (Source("openpi_fleet_epyc.json", "AMD EPYC"),
              Source("openpi_fleet_amx.json", "Intel Xeon, Sapphire Rapids")), openpi_fleet),
    Question("OpenPI: policies on the GPU",
             "A policy in the engine on the GPU, robots batched into one forward against one at a time.",
             (Source("openpi_gpu_h200.json", "The random-weight flow policy"),
              Source("openpi_gpu_h200_maze_policy.json", "The maze navigation policy")), openpi_gpu),
    Question("Speech: first audio",
             "Time from the text's arrival to the first PCM chunk, through the real server, on 2 CPU cores, and many "
             "sessions at once on one GPU.",
             (Source("tts_served_cpu_amx.json", "2 CPU cores, Intel Xeon, Sapphire Rapids"),
              Source("tts_served_cpu_bf16_epyc.json", "2 CPU cores, AMD EPYC"),
              Source("tts_h200.json", "32 sessions on one GPU", render=tts_gpu)), tts_served),
    Question("Speech beside a world",
             "First audio and stalls while a maze world session shares the same 2 CPU cores.",
             (Source("tts_mixed_cpu_amx.json", select=last_run),), tts_beside_world),
    Question("KV cache and paged attention",
             "Paged attention against contiguous attention, swap against copy bandwidth, and the per-tick "
             "bookkeeping of 128 sessions.",
             (Source("kv_gpu.json", "Attention and swap"),
              Source("kv_triton_check.json", "The Triton paged kernel", render=kv_triton),
              Source("kv_bookkeeping_h200.json", "Bookkeeping", render=kv_bookkeeping)), kv_gpu),
    Question("Wan VAE decode",
             "Decoding LingBot's latents block by block as they are generated, against decoding all at once.",
             (Source("wan_vae_decode_h200.json"),), wan_vae),
    Question("Soak",
             "Mixed load for minutes against a real server process: nothing fails, no chunk or event is lost, every "
             "KV block comes back, memory stays flat, the log stays clean.",
             (Source("soak_h200.json", "32 worlds and 8 robots on one GPU"),
              Source("soak_ahead_h200.json", "The same with two ticks per session in flight"),
              Source("soak_auto_cpu.json", "Worlds, robots and voices on 2 CPU cores")), soak),
    Question("World frames as H.264",
             "world.v1's `h264` (libx264 through PyAV, realtime/video.py) against `jpeg` q92 on rendered maze "
             "corridors at 480x832: bytes a frame and PSNR/SSIM against the raw frames, and the encoder's time. Goal: "
             "h264 at most 1/5 of jpeg's bytes at equal or better PSNR; at most 8 ms a frame on one CPU core; 4 "
             "sessions at 16 frames/s each on 2 cores.",
             (Source("h264_maze_cpu.json"),), h264_maze),
    Question("Key press to the page's canvas: h264 against jpeg",
             "End to end on the demo page in real Chromium: from a key press to the first canvas paint that shows "
             "its effect, world.v1 `h264` (WebCodecs) against `jpeg`. Goal: h264's median no more than one frame "
             "interval above jpeg's.",
             (Source("page_latency_cpu.json"),), page_latency),
    Question("Replicas behind nginx",
             "Several replicas behind nginx against connecting to each directly, and what the proxy adds per chunk.",
             (Source("deploy_replicas_cpu.json"),), replicas),
    Question("Fuzzing",
             "Hostile frames of every protocol through each decoder and against a live server.",
             (Source("fuzz.json"),), fuzz),
)

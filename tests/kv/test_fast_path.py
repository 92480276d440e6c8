"""The vectorised batch path and the per-row path are the same state machine.

Two caches, one with ``fast_path=False``, run the same random sequence of
open / begin (some restarting their sessions) / commit / abort / reset / close / evict
(residency with swap and drops); after every step every observable must be equal: each batch's index,
rows and start frames, the free queue in order, every table row, states and
cross slots, and the errors raised.
"""

import random
from collections import Counter

import numpy as np
import pytest
import torch

from kv.batch import KVBatch
from kv.block_pool import NULL_BLOCK
from kv.cache import PagedKVCache
from kv.geometry import KVGeometry
from kv.residency import Residency, ResidencyError

GEOMETRIES = {
    "maze": dict(sink_frames=1, window_frames=3),
    "ppf2_span2": dict(tokens_per_frame=4, sink_frames=2, window_frames=3, span_frames=2,
                        frames_per_tick=2),
    "cfg_cross": dict(sink_frames=1, window_frames=2, branches=("pos", "neg"), cross_tokens=2),
    "no_sink_tick3": dict(sink_frames=0, window_frames=4, frames_per_tick=3),
    # DreamZero-style: two branches, chunks of 1 or 2 frames, some restarting their sessions.
    "restarts": dict(sink_frames=1, window_frames=4, frames_per_tick=2, branches=("cond", "neg")),
}


def geometry(**kw):
    base = dict(num_layers=1, kv_heads=1, head_dim=2, tokens_per_frame=2, block_size=2,
                sink_frames=1, window_frames=3, frames_per_tick=1, dtype=torch.float32)
    base.update(kw)
    return KVGeometry(**base)


def observe(c: PagedKVCache, r: Residency) -> tuple:
    """Everything the two paths must agree on, as plain values."""
    t = c.tables
    sessions = []
    for sid in c.session_ids:
        s = c.session(sid)
        rows = [(b, int(t.held[row]), int(t.pending[row]), int(t.frames[row]),
                 int(t.window_start[row]), t.pages[row].tolist())
                for b, row in zip(s.branches, s.rows)]
        sessions.append((sid, s.state.name, s.cross_slots, rows))
    m = r.metrics()
    return (c.pool.free_ids(), c.num_resident, sessions, r.lru_order(), r.host_bytes,
            sorted(c._restarts.items()), (m["swap_outs"], m["swap_ins"], m["drops"]))


def check_invariants(c: PagedKVCache) -> None:
    t = c.tables
    owned = []
    for sid in c.session_ids:
        s = c.session(sid)
        for row in s.rows:
            n = int(t.held[row] + t.pending[row])
            assert not t.pages[row, n:].any()            # null past the row's pages
            if s.state.name != "SWAPPED":
                owned += t.pages[row, :n].tolist()
    for saved in c._restarts.values():        # pages a restarting chunk set aside
        owned += [b for _, blocks, _, _ in saved for b in blocks]
    assert len(owned) == len(set(owned)) and NULL_BLOCK not in owned
    assert not set(owned) & set(c.pool.free_ids())
    reserved = 1 + len(c.worker_blocks)
    assert len(owned) + c.num_free_blocks + reserved == c.pool.num_blocks - 1


def batch_view(batch) -> tuple:
    return (batch.index.tolist(), batch.rows, batch.start_frames, batch.num_pages,
            batch.session_ids, batch.chunk_pages, batch.size)


def play(fast: bool, g: KVGeometry, seed: int, steps: int = 400, restarts: bool = False) -> tuple[list, Counter]:
    rng = random.Random(seed)
    c = PagedKVCache(g, 40, max_sessions=4, fast_path=fast)
    page_bytes = g.num_layers * 2 * g.block_bytes
    r = Residency(c, host_budget_bytes=rng.choice([0, 12 * page_bytes, 1 << 20]))
    used = Counter()
    for name in ("begin_rows", "commit_rows"):
        vectorised = getattr(c.tables, name)

        def spy(*args, _f=vectorised, _n=name):
            used[_n] += 1
            return _f(*args)
        setattr(c.tables, name, spy)
    log = []
    in_flight: list = []    # open batches (KVBatch) not yet committed or aborted
    names = [f"s{i}" for i in range(7)]

    def record(tag, fn):
        try:
            out = fn()
        except (RuntimeError, ValueError, KeyError, ResidencyError) as e:
            log.append((tag, "raised", type(e).__name__, str(e)))
            return None
        log.append((tag, batch_view(out) if isinstance(out, KVBatch) else out))
        return out

    for _ in range(steps):
        open_ids = c.session_ids
        op = rng.choices(["open", "tick", "commit", "commit2", "abort", "single", "reset", "close",
                          "misuse"], [2, 8, 4, 1, 1, 2, 1, 1, 1])[0]
        if op == "open":
            sid = rng.choice(names)
            branches = None
            if g.num_branches > 1 and rng.random() < 0.3:
                branches = g.branches[:1]
            record(("open", sid), lambda: r.open(sid, branches))
        elif op == "tick" and open_ids:
            # Mostly sessions without a chunk in flight (a tick that can begin).
            idle = [sid for sid in open_ids if not c.in_flight(sid)]
            pick = idle if idle and rng.random() < 0.8 else open_ids
            ids = rng.sample(pick, rng.randint(1, len(pick)))
            frames = g.frames_per_tick * rng.choice([1, 1, 1, 2])
            pad = rng.choice([None, None, len(ids) + 2])
            restart = restarts and rng.random() < 0.15
            if restarts and rng.random() < 0.3:
                frames = 1
            record(("ensure", tuple(ids)), lambda: r.ensure_resident(ids))
            b = record(("begin", tuple(ids), frames, pad, restart),
                       lambda: c.begin_batch(ids, frames=frames, pad_to=pad, restart=restart))
            if b is not None:
                in_flight.append(b)
        elif op == "commit" and in_flight:
            b = in_flight.pop(rng.randrange(len(in_flight)))
            if rng.random() < 0.5:
                record(("commit_batch", b.session_ids), lambda: c.commit_batch(b))
            else:
                ids = list(b.session_ids)
                rng.shuffle(ids)
                record(("commit_chunks", tuple(ids)), lambda: c.commit_chunks(ids))
        elif op == "commit2" and len(in_flight) >= 2:
            # Two batches at once: their chunks may differ in length (per-row pending).
            a, b = in_flight.pop(), in_flight.pop()
            ids = list(a.session_ids + b.session_ids)
            rng.shuffle(ids)
            record(("commit_two", tuple(ids)), lambda: c.commit_chunks(ids))
        elif op == "abort" and in_flight:
            b = in_flight.pop(rng.randrange(len(in_flight)))
            record(("abort", b.session_ids), lambda: c.abort_batch(b))
        elif op == "single" and open_ids:
            sid = rng.choice(open_ids)
            what = rng.choice(["begin", "commit", "abort"])
            fn = {"begin": lambda: c.begin_chunk(sid), "commit": lambda: c.commit_chunk(sid),
                  "abort": lambda: c.abort_chunk(sid)}[what]
            record((what, sid), fn)
        elif op == "reset" and open_ids:
            sid = rng.choice(open_ids)
            record(("reset", sid), lambda: r.reset(sid, keep_cross=rng.random() < 0.5))
        elif op == "close" and open_ids:
            sid = rng.choice(open_ids)
            record(("close", sid), lambda: r.close(sid))
        elif op == "misuse" and open_ids:
            # Repeated ids, an unknown id, a second chunk: both paths raise the same error.
            sid = rng.choice(open_ids)
            ids = rng.choice([[sid, sid], [sid, "nobody"], [sid]])
            record(("misuse_begin", tuple(ids)), lambda: c.begin_batch(ids))
            record(("misuse_commit", tuple(ids)), lambda: c.commit_chunks(ids))
        check_invariants(c)
        log.append(observe(c, r))
    return log, used


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@pytest.mark.parametrize("seed", range(6))
def test_fast_and_per_row_paths_agree(name, seed):
    g = geometry(**GEOMETRIES[name])
    fast, used = play(True, g, seed, restarts=name == "restarts")
    slow, unused = play(False, g, seed, restarts=name == "restarts")
    assert not unused                         # fast_path=False never vectorises
    assert used["begin_rows"] > 20 and used["commit_rows"] > 10
    for i, (a, b) in enumerate(zip(fast, slow)):
        assert a == b, f"step {i}: {a} != {b}"
    assert len(fast) == len(slow)
    if name == "restarts":                    # restarting chunks were in flight, set-aside pages and all
        assert sum(1 for step in fast if isinstance(step, tuple) and len(step) == 7 and step[5]) > 5


def test_steady_state_batch_has_exact_tables():
    """128-style steady state in miniature: every row drops one frame per commit."""
    g = geometry(sink_frames=1, window_frames=2)
    c = PagedKVCache(g, 40, max_sessions=3)
    for sid in "abc":
        c.open(sid)
    for _ in range(3):
        c.commit_batch(c.begin_batch(["a", "b", "c"]))
    # frames 0..2 committed: a, b, c hold [sink, f1, f2] = blocks in allocation order.
    assert [c.table(s).held for s in "abc"] == [[2, 5, 8], [3, 6, 9], [4, 7, 10]]
    batch = c.begin_batch(["c", "a"], pad_to=3)
    assert batch.index.tolist() == [4, 4, 1,                 # lengths (pad row: its chunk)
                                    -1, -1, -1,              # no cross attention
                                    4, 7, 10, 11,            # c: held, then its chunk
                                    2, 5, 8, 12,             # a
                                    1, 0, 0, 0]              # pad row: the pad block, null-padded
    c.commit_batch(batch)
    assert c.pool.free_ids()[-2:] == [7, 5]                  # frame 1 of c, then of a
    assert [c.table(s).held for s in "ca"] == [[4, 10, 11], [2, 8, 12]]
    assert c.table("a").positional() == [2, 0, 8, 12]


def test_a_mixed_batch_prunes_only_full_windows():
    """Young and warm sessions in one batch: only the warm rows move (the general vectorised shift)."""
    g = geometry(tokens_per_frame=4, sink_frames=1, window_frames=1)  # 2 pages per frame
    c = PagedKVCache(g, 40, max_sessions=2)
    c.open("old")
    for _ in range(2):
        c.commit_batch(c.begin_batch(["old"]))
    c.open("new")
    assert c.table("old").held == [2, 3, 4, 5]
    c.commit_batch(c.begin_batch(["new", "old"]))
    assert c.table("new").held == [6, 7]
    assert c.table("old").held == [2, 3, 8, 9]
    assert c.pool.free_ids()[-2:] == [4, 5]
    assert c.tables.pages[c.session("old").rows[0]].tolist()[4:] == [0] * (c.tables.width - 4)
    assert np.array_equal(c.tables.window_start[[0, 1]], [2, 1])


def test_the_random_sequences_swap_and_drop():
    """The sequences above reach swap-out, swap-in and drops (here seed 4 of the maze geometry)."""
    log, _ = play(True, geometry(**GEOMETRIES["maze"]), 4)
    assert log[-1][-1] == (13, 13, 5)                     # swap-outs, swap-ins, drops

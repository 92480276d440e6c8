"""Positional block tables with sink + window retention, one row per session branch.

Page ``p`` holds tokens ``[p * block_size, (p + 1) * block_size)`` of a branch's
sequence; frame ``f`` is pages ``[f * ppf, (f + 1) * ppf)``. A table is
positional: ``block_at(p)`` is the block of page ``p``, or the null block when
the page was released (between the sink and the window). Only the sink pages
and the window pages are stored, so memory stays bounded however long a session
runs::

    pages:  [ sink ] [ null ... null ] [ window ] [ pending ]
             0..s-1   s..w-1            w..n-1     n..n+t-1

``pending`` is the in-flight chunk: ``begin`` sets it, ``commit`` keeps it and
prunes the window (``retention.freed_on_commit``), ``abort`` gives it back.
Block ids only; the caller owns the pool and frees what these methods return.

``BlockTables`` keeps every row of a cache in numpy arrays, so that a batch is
a few vectorised operations however many rows it has (``begin_rows``,
``commit_rows``, ``gather``); the same transitions exist one row at a time
(``begin``, ``commit``, ...) for single sessions and rare cases, and tests run
both on the same sequences. Row ``r`` is::

    pages[r]:  [ held[r] stored pages | pending[r] chunk pages | 0 0 ... 0 ]
                 sink, then window      (in flight)              null-padded

    held[r]     stored pages (sink + window), pending[r] the chunk's pages,
    frames[r]   committed frames, window_start[r] = retention.window_start(frames[r])

Stored pages are in page order and everything after them is the null block, so
a row of ``pages`` is already the row a ``KVBatch`` attends to. ``BlockTable``
is one row seen as an object (and, built on its own, a one-row store).
"""

from __future__ import annotations

import numpy as np

from kv import retention
from kv.block_pool import NULL_BLOCK


class BlockTables:
    """Every row's positional block table, in arrays (see the module docstring)."""

    def __init__(self, sink: int, window: int, span: int, pages_per_frame: int, *,
                 rows: int = 1, chunk_pages: int | None = None) -> None:
        self.sink = sink
        self.window = window
        self.span = span
        self.ppf = pages_per_frame
        # Most stored pages of a row between ticks; rows are this wide plus one chunk
        # (``chunk_pages``; unknown: the smallest chunk, one span, and ``begin`` widens).
        self.max_held = pages_per_frame * retention.max_retained_frames(sink, window, span)
        width = self.max_held + (chunk_pages or pages_per_frame * span)
        self.pages = np.zeros((rows, width), dtype=np.int32)
        self.held = np.zeros(rows, dtype=np.int64)
        self.pending = np.zeros(rows, dtype=np.int64)
        self.frames = np.zeros(rows, dtype=np.int64)
        self.window_start = np.full(rows, sink, dtype=np.int64)

    @property
    def num_rows(self) -> int:
        return len(self.held)

    @property
    def width(self) -> int:
        return self.pages.shape[1]

    def grow(self, rows: int) -> None:
        """Room for at least ``rows`` rows (new rows are empty tables)."""
        extra = rows - self.num_rows
        if extra <= 0:
            return
        self.pages = np.concatenate([self.pages, np.zeros((extra, self.width), np.int32)])
        self.held = np.concatenate([self.held, np.zeros(extra, np.int64)])
        self.pending = np.concatenate([self.pending, np.zeros(extra, np.int64)])
        self.frames = np.concatenate([self.frames, np.zeros(extra, np.int64)])
        self.window_start = np.concatenate([self.window_start, np.full(extra, self.sink, np.int64)])

    def _fit_chunk(self, chunk_pages: int) -> None:
        """Widen rows so that a full row plus a chunk of ``chunk_pages`` pages fits."""
        need = self.max_held + chunk_pages
        if need > self.width:
            pad = np.zeros((self.num_rows, need - self.width), np.int32)
            self.pages = np.concatenate([self.pages, pad], axis=1)

    # -- one row ----------------------------------------------------------------

    def begin(self, r: int, blocks: list[int], frames: int) -> None:
        if self.pending.item(r):
            raise RuntimeError("a chunk is already in flight")
        T = len(blocks)
        if T != frames * self.ppf:
            raise ValueError(f"{frames} frames need {frames * self.ppf} blocks, got {T}")
        self._fit_chunk(T)
        h = self.held.item(r)
        self.pages[r, h:h + T] = blocks
        self.pending[r] = T

    def commit(self, r: int) -> list[int]:
        """Keep row ``r``'s pending chunk; return the blocks that fell out of the window."""
        T = self.pending.item(r)
        n1 = self.frames.item(r) + T // self.ppf
        h = self.held.item(r) + T
        start = self.window_start.item(r)
        # retention.window_start(n1), inlined: single-session commits are hot
        # too (tests check the two agree).
        stop = self.span * ((n1 - self.window) // self.span)
        if stop < self.sink:
            stop = self.sink
        released: list[int] = []
        if stop > start:
            # The released frames follow the sink, which is full by now (stop > sink).
            lo = self.sink * self.ppf
            d = (stop - start) * self.ppf
            row = self.pages[r]
            released = row[lo:lo + d].tolist()
            row[lo:h - d] = row[lo + d:h]
            row[h - d:h] = NULL_BLOCK
            h -= d
            self.window_start[r] = stop
        self.held[r] = h
        self.frames[r] = n1
        self.pending[r] = 0
        return released

    def abort(self, r: int) -> list[int]:
        """Drop row ``r``'s pending chunk; committed state is untouched."""
        h, T = self.held.item(r), self.pending.item(r)
        blocks = self.pages[r, h:h + T].tolist()
        self.pages[r, h:h + T] = NULL_BLOCK
        self.pending[r] = 0
        return blocks

    def clear(self, r: int) -> list[int]:
        """Forget everything of row ``r`` (reset/close); return every block held or pending."""
        blocks = self.pages[r, :self.held[r] + self.pending[r]].tolist()
        self.pages[r] = NULL_BLOCK
        self.held[r] = self.pending[r] = self.frames[r] = 0
        self.window_start[r] = self.sink
        return blocks

    def detach(self, r: int) -> tuple[list[int], int, int]:
        """Empty row ``r`` without freeing its stored pages (a restarting chunk's ``begin``):
        returns ``(stored blocks, committed frames, window start)`` for ``reattach``."""
        if self.pending.item(r):
            raise RuntimeError("a chunk is already in flight")
        saved = (self.stored(r), int(self.frames[r]), int(self.window_start[r]))
        self.pages[r] = NULL_BLOCK
        self.held[r] = self.frames[r] = 0
        self.window_start[r] = self.sink
        return saved

    def reattach(self, r: int, blocks: list[int], frames: int, window_start: int) -> None:
        """Put back what ``detach`` returned into the empty row ``r`` (an aborted restart)."""
        if self.held.item(r) or self.pending.item(r):
            raise RuntimeError(f"row {r} is not empty")
        self.pages[r, :len(blocks)] = blocks
        self.held[r] = len(blocks)
        self.frames[r] = frames
        self.window_start[r] = window_start

    def stored(self, r: int) -> list[int]:
        return self.pages[r, :self.held[r]].tolist()

    def in_flight(self, r: int) -> list[int]:
        h = self.held[r]
        return self.pages[r, h:h + self.pending[r]].tolist()

    def set_stored(self, r: int, blocks: list[int]) -> None:
        """Replace row ``r``'s stored pages, same count, same order (a swap-in's new blocks)."""
        h = int(self.held[r])
        if len(blocks) != h or self.pending[r]:
            raise ValueError(f"row {r} stores {h} pages and nothing in flight, got {len(blocks)}")
        self.pages[r, :h] = blocks

    # -- many rows at once ---------------------------------------------------------
    # ``rows`` are distinct; these do what the one-row methods do to each row, in
    # row order (tests check that state and returned blocks are identical).

    def begin_rows(self, rows: np.ndarray, blocks: np.ndarray, chunk_pages: int) -> np.ndarray:
        """``begin`` for rows not in flight, ``chunk_pages`` blocks each, ``blocks`` row-major.

        Returns each row's page count with the chunk (held + chunk).
        """
        self._fit_chunk(chunk_pages)
        held = self.held[rows]
        if chunk_pages == 1:
            self.pages[rows, held] = blocks
        else:
            cols = held[:, None] + np.arange(chunk_pages)
            self.pages[rows[:, None], cols] = blocks.reshape(len(rows), chunk_pages)
        self.pending[rows] = chunk_pages
        return held + chunk_pages

    def commit_rows(self, rows: np.ndarray) -> np.ndarray:
        """``commit`` for in-flight rows; returns the released blocks, row by row in page order."""
        pending = self.pending[rows]
        n1 = self.frames[rows] + (pending if self.ppf == 1 else pending // self.ppf)
        start = self.window_start[rows]
        stop = self._window_start(n1)
        drop = (stop - start) * self.ppf      # stored pages each row releases (window_start only grows)
        held = self.held[rows] + pending
        self.frames[rows] = n1
        self.pending[rows] = 0
        self.window_start[rows] = stop
        d = int(drop.max())
        if d == 0:                            # young sessions only: nothing leaves the window
            self.held[rows] = held
            return np.empty(0, dtype=np.int64)
        self.held[rows] = held - drop
        # Releasing rows have a full sink, so their released pages start at the
        # same column ``lo`` and the rest of the row moves left by ``drop``.
        lo = self.sink * self.ppf
        if drop.min() == d:                   # steady state: every row drops as many pages
            table = self.pages[rows]
            released = table[:, lo:lo + d].astype(np.int64).ravel()  # a copy, before the shift
            table[:, lo:-d] = table[:, lo + d:]
            table[:, -d:] = NULL_BLOCK
        else:
            table = self.pages[rows]
            cols = np.arange(self.width)
            after = cols >= lo
            released = table[after & (cols < lo + drop[:, None])].astype(np.int64)
            src = np.minimum(cols + after * drop[:, None], self.width - 1)
            table = np.take_along_axis(table, src, axis=1)
            table[cols >= (held - drop)[:, None]] = NULL_BLOCK
        self.pages[rows] = table
        return released

    def _window_start(self, n: np.ndarray) -> np.ndarray:
        """``retention.window_start`` of each ``n``, vectorised."""
        if self.span == 1:
            return np.maximum(n - self.window, self.sink)
        return np.maximum(self.span * ((n - self.window) // self.span), self.sink)


class BlockTable:
    """One branch's table: a row of a ``BlockTables`` seen as an object.

    ``BlockTable(sink, window, span, pages_per_frame)`` is a table of its own
    (a one-row store); ``BlockTables.view`` rows share their store.
    """

    __slots__ = ("_store", "_row")

    def __init__(self, sink: int, window: int, span: int, pages_per_frame: int) -> None:
        self._store = BlockTables(sink, window, span, pages_per_frame)
        self._row = 0

    @classmethod
    def view(cls, store: BlockTables, row: int) -> "BlockTable":
        t = cls.__new__(cls)
        t._store = store
        t._row = row
        return t

    # -- the in-flight chunk -------------------------------------------------

    def begin(self, blocks: list[int], frames: int) -> None:
        self._store.begin(self._row, blocks, frames)

    def commit(self) -> list[int]:
        """Keep the pending chunk; return the blocks that fell out of the window."""
        return self._store.commit(self._row)

    def abort(self) -> list[int]:
        """Drop the pending chunk; committed state is untouched."""
        return self._store.abort(self._row)

    def clear(self) -> list[int]:
        """Forget everything (reset/close); return every block held or pending."""
        return self._store.clear(self._row)

    def remap(self, mapping: dict[int, int]) -> None:
        """Replace block ids (after a swap-in placed the pages in new blocks)."""
        st, r = self._store, self._row
        n = int(st.held[r] + st.pending[r])
        st.pages[r, :n] = [mapping[b] for b in st.pages[r, :n].tolist()]

    # -- reading -------------------------------------------------------------

    @property
    def held(self) -> list[int]:
        """Stored blocks (sink, then window) in page order: what the next chunk attends to."""
        return self._store.stored(self._row)

    @property
    def pending(self) -> list[int]:
        """The in-flight chunk's blocks (empty when none)."""
        return self._store.in_flight(self._row)

    @property
    def pending_frames(self) -> int:
        return int(self._store.pending[self._row]) // self._store.ppf

    @property
    def num_frames(self) -> int:
        """Committed frames."""
        return int(self._store.frames[self._row])

    @property
    def num_sink_pages(self) -> int:
        st = self._store
        return min(st.sink, int(st.frames[self._row])) * st.ppf

    @property
    def window_start_frame(self) -> int:
        return int(self._store.window_start[self._row])

    def attend_blocks(self) -> list[int]:
        """Blocks a query of the pending chunk attends to: held pages, then the chunk."""
        st, r = self._store, self._row
        return st.pages[r, :st.held[r] + st.pending[r]].tolist()

    def block_at(self, page: int) -> int:
        """Block of page ``page`` (committed or pending); the null block if released."""
        st, r = self._store, self._row
        ppf = st.ppf
        committed_pages = int(st.frames[r]) * ppf
        pending = int(st.pending[r])
        if page < 0 or page >= committed_pages + pending:
            raise IndexError(f"page {page} beyond {committed_pages + pending} pages")
        held = int(st.held[r])
        if page >= committed_pages:
            return int(st.pages[r, held + page - committed_pages])
        sink_pages = self.num_sink_pages
        if page < sink_pages:
            return int(st.pages[r, page])
        first_window_page = int(st.window_start[r]) * ppf
        if page >= first_window_page:
            return int(st.pages[r, sink_pages + page - first_window_page])
        return NULL_BLOCK

    def positional(self) -> list[int]:
        """The whole table page by page, null blocks included (tests, debugging)."""
        st, r = self._store, self._row
        total = int(st.frames[r]) * st.ppf + int(st.pending[r])
        return [self.block_at(p) for p in range(total)]

"""One branch's positional block table with sink + window retention.

Page ``p`` holds tokens ``[p * block_size, (p + 1) * block_size)`` of the branch's
sequence; frame ``f`` is pages ``[f * ppf, (f + 1) * ppf)``. The table is
positional: ``block_at(p)`` is the block of page ``p``, or the null block when the
page was released (between the sink and the window). Only the sink pages and the
window pages are stored, so memory stays bounded however long a session runs::

    pages:  [ sink ] [ null ... null ] [ window ] [ pending ]
             0..s-1   s..w-1            w..n-1     n..n+t-1

``pending`` is the in-flight chunk: ``begin`` sets it, ``commit`` keeps it and
prunes the window (``retention.released_on_commit``), ``abort`` gives it back.
Block ids only; the caller owns the pool and frees what these methods return.
"""

from __future__ import annotations

from array import array

from kv import retention
from kv.block_pool import NULL_BLOCK


class BlockTable:
    __slots__ = ("sink", "window", "chunk", "ppf", "num_frames", "num_sink_pages",
                 "_window_start", "pending", "pending_frames", "held")

    def __init__(self, sink: int, window: int, chunk: int, pages_per_frame: int) -> None:
        self.sink = sink
        self.window = window
        self.chunk = chunk
        self.ppf = pages_per_frame
        self.num_frames = 0  # committed frames
        # held = sink pages (the first num_sink_pages entries) then window pages,
        # in page order: what the next chunk attends to besides itself. An int32
        # array, not a list: batches copy it into their index with one memcpy.
        self.held = array("i")
        self.num_sink_pages = 0
        self._window_start = sink  # first frame of the window part of ``held``
        self.pending: list[int] = []
        self.pending_frames = 0

    # -- the in-flight chunk -------------------------------------------------

    def begin(self, blocks: list[int], frames: int) -> None:
        if self.pending_frames:
            raise RuntimeError("a chunk is already in flight")
        if len(blocks) != frames * self.ppf:
            raise ValueError(f"{frames} frames need {frames * self.ppf} blocks, got {len(blocks)}")
        self.pending = blocks
        self.pending_frames = frames

    def commit(self) -> list[int]:
        """Keep the pending chunk; return the blocks that fell out of the window."""
        n0 = self.num_frames
        n1 = n0 + self.pending_frames
        ppf = self.ppf
        held = self.held
        held.extend(self.pending)
        if n0 < self.sink:  # a young session: new pages below the sink join it
            self.num_sink_pages = min(self.sink, n1) * ppf
        # This is retention.released_on_commit(n0, n1, ...): its lower end,
        # window_start(n0), is self._window_start already; the new start is
        # retention.window_start(n1, ...), inlined because it runs for every
        # session on every tick (tests check the two agree).
        sink, chunk = self.sink, self.chunk
        stop = chunk * ((n1 - self.window) // chunk)
        if stop < sink:
            stop = sink
        released: list[int] = []
        if stop > self._window_start:
            lo = self.num_sink_pages
            hi = lo + (stop - self._window_start) * ppf
            released = held[lo:hi].tolist()
            del held[lo:hi]
            self._window_start = stop
        self.num_frames = n1
        self.pending = []
        self.pending_frames = 0
        return released

    def abort(self) -> list[int]:
        """Drop the pending chunk; committed state is untouched."""
        blocks = self.pending
        self.pending = []
        self.pending_frames = 0
        return blocks

    def clear(self) -> list[int]:
        """Forget everything (reset/close); return every block held or pending."""
        blocks = self.held.tolist() + self.pending
        self.num_frames = 0
        self.held = array("i")
        self.num_sink_pages = 0
        self._window_start = self.sink
        self.pending = []
        self.pending_frames = 0
        return blocks

    # -- reading -------------------------------------------------------------

    @property
    def window_start_frame(self) -> int:
        return self._window_start

    def attend_blocks(self) -> list[int]:
        """Blocks a query of the pending chunk attends to: held pages, then the chunk."""
        return self.held.tolist() + self.pending

    def block_at(self, page: int) -> int:
        """Block of page ``page`` (committed or pending); the null block if released."""
        committed_pages = self.num_frames * self.ppf
        if page < 0 or page >= committed_pages + len(self.pending):
            raise IndexError(f"page {page} beyond {committed_pages + len(self.pending)} pages")
        if page >= committed_pages:
            return self.pending[page - committed_pages]
        if page < self.num_sink_pages:
            return self.held[page]
        first_window_page = self._window_start * self.ppf
        if page >= first_window_page:
            return self.held[self.num_sink_pages + page - first_window_page]
        return NULL_BLOCK

    def positional(self) -> list[int]:
        """The whole table page by page, null blocks included (tests, debugging)."""
        total = self.num_frames * self.ppf + len(self.pending)
        return [self.block_at(p) for p in range(total)]

    def remap(self, mapping: dict[int, int]) -> None:
        """Replace block ids (after a swap-in placed the pages in new blocks)."""
        self.held = array("i", [mapping[b] for b in self.held])
        self.pending = [mapping[b] for b in self.pending]

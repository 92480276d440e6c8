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

from collections import deque

from kv import retention
from kv.block_pool import NULL_BLOCK


class BlockTable:
    __slots__ = ("sink", "window", "chunk", "ppf", "num_frames", "_sink_blocks",
                 "_window_blocks", "_window_start", "pending", "pending_frames", "held")

    def __init__(self, sink: int, window: int, chunk: int, pages_per_frame: int) -> None:
        self.sink = sink
        self.window = window
        self.chunk = chunk
        self.ppf = pages_per_frame
        self.num_frames = 0  # committed frames
        self._sink_blocks: list[int] = []
        self._window_blocks: deque[int] = deque()
        self._window_start = sink  # first frame the window deque holds
        self.pending: list[int] = []
        self.pending_frames = 0
        # sink + window blocks in page order: what the next chunk attends to
        # (besides itself). Rebuilt on every change; read on every tick.
        self.held: list[int] = []

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
        new = self.pending
        # New pages that land inside the sink (young sessions) join the sink.
        to_sink = max(0, min(len(new), self.sink * self.ppf - n0 * self.ppf))
        if to_sink:
            self._sink_blocks.extend(new[:to_sink])
            self._window_blocks.extend(new[to_sink:])
        else:
            self._window_blocks.extend(new)
        gone = retention.released_on_commit(n0, n1, self.sink, self.window, self.chunk)
        pop = self._window_blocks.popleft
        released = [pop() for _ in range(len(gone) * self.ppf)]
        if len(gone):
            self._window_start = gone.stop
        self.num_frames = n1
        self.pending = []
        self.pending_frames = 0
        self.held = self._sink_blocks + list(self._window_blocks)
        return released

    def abort(self) -> list[int]:
        """Drop the pending chunk; committed state is untouched."""
        blocks = self.pending
        self.pending = []
        self.pending_frames = 0
        return blocks

    def clear(self) -> list[int]:
        """Forget everything (reset/close); return every block held or pending."""
        blocks = self._sink_blocks + list(self._window_blocks) + self.pending
        self.num_frames = 0
        self._sink_blocks = []
        self._window_blocks = deque()
        self._window_start = self.sink
        self.pending = []
        self.pending_frames = 0
        self.held = []
        return blocks

    # -- reading -------------------------------------------------------------

    @property
    def window_start_frame(self) -> int:
        return self._window_start

    def attend_blocks(self) -> list[int]:
        """Blocks a query of the pending chunk attends to: held pages, then the chunk."""
        return self.held + self.pending

    def block_at(self, page: int) -> int:
        """Block of page ``page`` (committed or pending); the null block if released."""
        ppf = self.ppf
        committed_pages = self.num_frames * ppf
        if page < 0 or page >= committed_pages + len(self.pending):
            raise IndexError(f"page {page} beyond {committed_pages + len(self.pending)} pages")
        if page >= committed_pages:
            return self.pending[page - committed_pages]
        if page < len(self._sink_blocks):
            return self._sink_blocks[page]
        first_window_page = self._window_start * ppf
        if page >= first_window_page:
            return self._window_blocks[page - first_window_page]
        return NULL_BLOCK

    def positional(self) -> list[int]:
        """The whole table page by page, null blocks included (tests, debugging)."""
        total = self.num_frames * self.ppf + len(self.pending)
        return [self.block_at(p) for p in range(total)]

    def remap(self, mapping: dict[int, int]) -> None:
        """Replace block ids (after a swap-in placed the pages in new blocks)."""
        self._sink_blocks = [mapping[b] for b in self._sink_blocks]
        self._window_blocks = deque(mapping[b] for b in self._window_blocks)
        self.pending = [mapping[b] for b in self.pending]
        self.held = self._sink_blocks + list(self._window_blocks)

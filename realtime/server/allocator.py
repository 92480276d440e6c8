"""glibc malloc thresholds for a server that handles large messages.

By default glibc adapts its mmap threshold and trims the heap top, so a server
that decodes ~450 KB observations maps or grows fresh pages for each request:
about 100 page faults per OpenPI call, a third of its loopback latency
(bench/results/openpi_loopback_profile.json). Fixed thresholds keep freed
buffers in the heap for reuse, at the cost of holding up to the trim threshold
of freed memory.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 16 << 20, trim_threshold: int = 128 << 20) -> bool:
    """Set fixed mmap/trim thresholds; False (and nothing changed) off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    except (OSError, AttributeError):
        return False
    if ok:
        log.info("malloc: mmap threshold %d MiB, trim threshold %d MiB", mmap_threshold >> 20, trim_threshold >> 20)
    return ok

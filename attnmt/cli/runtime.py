"""Process-wide settings that attnmt's own commands apply (never on import: a library user's process is
theirs to configure).

``keep_freed_memory``: decoding frees and allocates the same few large tensors every step (the logits and
log-probabilities of every row, 10 MB each for 320 rows x 8,000 pieces). glibc's malloc serves blocks that
size with fresh ``mmap`` pages, or trims them off the heap once freed, so each step pays page faults to get
zeroed memory back from the kernel. Raising the mmap threshold to its maximum (32 MiB) and the trim threshold
to 1 GiB keeps freed memory in the process for reuse; ``scripts/bench/bench_decode.py --equal-work`` with and
without ``--no-malloc-tuning`` (under ``/usr/bin/time`` for the page faults) measures what that saves. The
cost is that up to 1 GiB of freed memory is held until the process ends, which suits a command that translates
and exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as above. Returns whether it took effect (False off Linux or off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no libc found, or one without mallopt (musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1

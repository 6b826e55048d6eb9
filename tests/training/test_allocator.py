"""``training.allocator``: after ``keep_freed_memory`` glibc serves a large block from its heap, not from a
fresh ``mmap``, and a freed one is kept for the next step until ``release_freed_memory`` (``mallinfo2``:
mapped bytes against the heap's free bytes; then the resident size), in a child process so that this
one's allocator is left as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, os, sys
import torch
from attnmt.training.allocator import keep_freed_memory, release_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory()
big = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, over any mmap threshold, its pages touched
mapped = libc.mallinfo2().hblkhd
del big
kept, before = libc.mallinfo2().fordblks, resident()
release_freed_memory()
print(mapped, kept, before - resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_large_blocks_come_from_the_heap_and_stay_there_once_freed():
    def child(mode: str) -> tuple[int, ...]:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
        return tuple(int(n) for n in out.stdout.split())

    mapped, free, _ = child("default")
    assert mapped >= 64 * 2**20  # glibc's default: a fresh mapping, returned when freed
    assert free < 64 * 2**20
    mapped, free, released = child("keep")
    assert mapped < 64 * 2**20  # from the heap
    assert free >= 64 * 2**20  # freed, and kept for the next step
    assert released >= 60 * 2**20  # resident until release_freed_memory hands the pages back

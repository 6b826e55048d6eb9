"""What this machine's processor can do, read once from ``/proc/cpuinfo``: the flags that choose a path
(native bf16 for training's precision, native int8 products for the quantized engine of ``--int8``)."""

from __future__ import annotations

import functools


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first processor's flags in ``/proc/cpuinfo`` (Linux), read once; empty where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()

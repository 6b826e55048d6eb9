"""How each attention kernel's time and memory grow with the sequence length, measured one call at a time in
fresh processes, and the growth exponent fitted to them (``attnmt study``,
``scripts/bench/bench_attention.py``).

Encoder self-attention, no mask, not causal: batch 1, 4 heads, d_model 256 (d_head 64). Each (kernel,
length, mode, what) runs in a fresh child (``python -m attnmt.study.growth --child ...``), so that neither the
allocator state nor the page cache of one measurement reaches another. Modes: ``forward`` (under
``torch.no_grad``) and ``backward`` (forward + backward).

Memory: the child allocates the inputs, runs the kernel once to warm up, resets its peak-RSS counter
(writing 5 to /proc/self/clear_refs), notes its RSS, runs the kernel once more and reports VmHWM minus that
RSS: the peak extra memory of one call, outputs included. This child starts with MALLOC_MMAP_THRESHOLD_
fixed at 64 KiB so glibc serves every large tensor with mmap and gives it back on free (with the default
dynamic threshold, freed blocks stay resident and a later call's peak hides inside them). tracemalloc cannot
see torch's allocations. Linux only.

Time: the median wall time of ``repeats`` calls after a warm-up call, with the default allocator, on
``threads`` intra-op threads (one by default: on a small shared VM two OpenMP threads sometimes stall a
parallel region by tens of ms, which swamps the small kernels).

Growth exponent: the least-squares slope of log(value) against log(n) over n >= 1024 (the upper half of the
lengths, at least two, when fewer than two reach 1024), printed beside the exponent the tutorials claim.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..children import arm_from_env, popen

LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
BATCH, HEADS, D_MODEL = 1, 4, 256
MODES = ("forward", "backward")
WHATS = ("ms", "mib")  # median time of one call; peak extra memory of one call

# The growth the tutorials claim, as an exponent of n: (time, memory). sparse runs with its defaults,
# window = stride = ceil(sqrt(n)), hence n sqrt(n); SDPA's fused CPU kernel is flash attention: the
# products of softmax attention (n^2 time) a block at a time (n memory).
CLAIMED: dict[str, tuple[float, float]] = {
    "math": (2.0, 2.0),
    "sdpa": (2.0, 1.0),
    "linear": (1.0, 1.0),
    "sparse": (1.5, 1.5),
    "linformer": (1.0, 1.0),
    "performer": (1.0, 1.0),
}
COMPLEXITY = {1.0: "O(n)", 1.5: "O(n sqrt n)", 2.0: "O(n^2)"}


def _status_kib(name: str) -> int:
    """A ``VmRSS`` / ``VmHWM`` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {name} line")


def measure(kernel_name: str, n: int, what: str, mode: str, repeats: int, threads: int) -> float:
    """In a child: the median ms (``what="ms"``) or peak extra MiB (``"mib"``) of one call at length n."""
    import torch

    from ..models.kernel_modules import standalone_kernel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    backward = mode == "backward"
    kernel = standalone_kernel(kernel_name, D_MODEL // HEADS, n)
    q, k, v = (torch.randn(BATCH, HEADS, n, D_MODEL // HEADS, requires_grad=backward) for _ in range(3))

    def call() -> None:
        if backward:
            kernel(q, k, v)[0].sum().backward()
            for x in (q, k, v):
                x.grad = None
        else:
            with torch.no_grad():
                kernel(q, k, v)

    call()  # warm-up: lazy initialisation stays out of the numbers
    if what == "mib":
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # VmHWM back to the current RSS
        baseline = _status_kib("VmRSS")
        call()
        return max(_status_kib("VmHWM") - baseline, 0) / 1024
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def run_child(kernel_name: str, n: int, what: str, mode: str, repeats: int = 3,
              threads: int = 1) -> float | None:
    """One measurement in a fresh process; None when it failed (killed for memory, say)."""
    command = [sys.executable, "-m", "attnmt.study.growth", "--child", kernel_name, str(n), what, mode,
               "--repeats", str(repeats), "--threads", str(threads)]
    env = dict(os.environ)
    if what == "mib":
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    with popen(command, signal.SIGKILL, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
               text=True) as child:  # a measurement is worth nothing once its parent is gone
        stdout, _ = child.communicate()
    if child.returncode != 0:
        return None
    return float(stdout.strip().splitlines()[-1])


def fit_lengths(lengths: Sequence[int]) -> list[int]:
    """The lengths the exponent is fitted over: n >= 1024, else the upper half (at least two)."""
    upper = [n for n in lengths if n >= 1024]
    return upper if len(upper) >= 2 else list(lengths[min(len(lengths) // 2, len(lengths) - 2):])


def growth_exponent(lengths: Sequence[int], values: Sequence[float | None]) -> float | None:
    """The least-squares slope of log(value) on log(n) over ``fit_lengths``; None without two positive
    points."""
    fit = fit_lengths(lengths)
    points = [(math.log(n), math.log(y)) for n, y in zip(lengths, values, strict=True)
              if n in fit and y is not None and y > 0]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return (sum((x - mean_x) * (y - mean_y) for x, y in points)
            / sum((x - mean_x) ** 2 for x, _ in points))


@dataclass
class Growth:
    """Every measurement: ``values[kernel][mode][what]`` is a list over ``lengths`` (None where one
    failed), and the fitted exponents the same way (one number per kernel, mode and what)."""

    lengths: list[int]
    threads: int
    values: dict[str, dict[str, dict[str, list[float | None]]]] = field(default_factory=dict)

    def exponent(self, kernel: str, mode: str, what: str) -> float | None:
        return growth_exponent(self.lengths, self.values[kernel][mode][what])

    def to_json(self) -> dict:
        exponents = {k: {m: {w: self.exponent(k, m, w) for w in WHATS} for m in MODES} for k in self.values}
        return {"lengths": self.lengths, "threads": self.threads, "batch": BATCH, "heads": HEADS,
                "d_model": D_MODEL, "fit_lengths": fit_lengths(self.lengths), "values": self.values,
                "exponents": exponents, "claimed": {k: CLAIMED[k] for k in self.values}}


def measure_growth(kernels: Sequence[str], lengths: Sequence[int] = LENGTHS, repeats: int = 3,
                   threads: int = 1, on_done: Callable[[str], None] | None = None) -> Growth:
    """Every kernel at every length, both modes, time and memory, one child each; ``on_done(label)`` is
    told each measurement as it ends (a progress bar)."""
    growth = Growth(list(lengths), threads)
    for kernel in kernels:
        growth.values[kernel] = {mode: {what: [] for what in WHATS} for mode in MODES}
        for mode in MODES:
            for what in WHATS:
                for n in lengths:
                    value = run_child(kernel, n, what, mode, repeats, threads)
                    growth.values[kernel][mode][what].append(value)
                    if on_done is not None:
                        on_done(f"{kernel} {mode} {what} n={n}")
    return growth


def claimed_within(kernel: str, exponent: float, tolerance: float = 0.25) -> bool:
    """Whether a fitted time exponent is within ``tolerance`` of the one the tutorials claim."""
    return abs(exponent - CLAIMED[kernel][0]) <= tolerance


def exponent_rows(growth: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kernel: the fitted time and memory exponents (forward; forward + backward) beside the claimed
    ones, and whether the forward time's is within 0.25 of the claim."""
    rows = []
    for kernel, by_mode in growth.get("exponents", {}).items():
        claimed_time, claimed_memory = CLAIMED[kernel]
        fitted = by_mode["forward"]["ms"]
        rows.append({"kernel": kernel, "claimed": COMPLEXITY[claimed_time],
                     "claimed_time": claimed_time, "claimed_memory": claimed_memory,
                     "time": fitted, "time_backward": by_mode["backward"]["ms"],
                     "memory": by_mode["forward"]["mib"], "memory_backward": by_mode["backward"]["mib"],
                     "within": None if fitted is None else claimed_within(kernel, fitted)})
    return rows


def _child_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnmt.study.growth")
    parser.add_argument("--child", nargs=4, metavar=("KERNEL", "N", "WHAT", "MODE"), required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    kernel, n, what, mode = args.child
    print(measure(kernel, int(n), what, mode, args.repeats, args.threads))


if __name__ == "__main__":
    arm_from_env()  # dies with the process that measures (children.py)
    _child_main(sys.argv[1:])

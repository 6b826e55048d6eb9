"""Time and peak memory of the attention kernels on CPU, against sequence length.

Encoder self-attention, no mask, not causal: batch 1, 4 heads, d_model 256
(d_head 64), forward only under torch.no_grad (--backward: forward + backward).

    python scripts/bench_attention.py                      # 128 .. 8192
    python scripts/bench_attention.py --max-len 1024 --repeats 2

Each (kernel, length) runs in two fresh child processes (Linux only), one for
time and one for memory, so neither sees the other's allocator state.

Memory: the child allocates the inputs, runs the kernel once to warm up,
resets its peak-RSS counter (writing 5 to /proc/self/clear_refs), notes its
RSS, runs the kernel once more and reports VmHWM minus that RSS: the peak extra
memory of one call, outputs included. This child starts with
MALLOC_MMAP_THRESHOLD_ fixed at 64 KiB so glibc serves every large tensor with
mmap and gives it back on free; with the default dynamic threshold, freed
blocks stay resident and a later call's peak hides inside (or adds to) them.
tracemalloc cannot see torch's allocations.

Time: median wall time of --repeats calls after a warm-up call, in a child
with the default allocator (mmap for every tensor would add page faults).
Threads: --threads (default 1) intra-op threads per child. One thread by
default because on a small shared VM two OpenMP threads sometimes stall a
parallel region by tens of ms (a descheduled vCPU), which swamps the small
kernels; one thread gives repeatable numbers and a fair comparison.
Growth exponent: least-squares slope of log(value) against log(n) over n >= 1024
(the upper half of the lengths, at least two, when fewer than two reach 1024).
sparse runs with its defaults, window = stride = ceil(sqrt(n)): expect ~1.5.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time

KERNEL_NAMES = ("math", "sdpa", "linear", "sparse")
LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
BATCH, HEADS, D_MODEL = 1, 4, 256
KEYS = {"ms": "time", "mib": "memory"}  # result key -> what the child measures


def _status_kib(field: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def measure(kernel_name: str, n: int, what: str, repeats: int, backward: bool, threads: int) -> float:
    """Run in a child: median ms (what="time") or peak extra MiB ("memory") of one call at length n."""
    import torch

    from attnmt.attention import KERNELS

    kernel = KERNELS[kernel_name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    d_head = D_MODEL // HEADS
    q, k, v = (torch.randn(BATCH, HEADS, n, d_head, requires_grad=backward) for _ in range(3))

    def call() -> None:
        if backward:
            context, _ = kernel(q, k, v)
            context.sum().backward()
            for x in (q, k, v):
                x.grad = None
        else:
            with torch.no_grad():
                kernel(q, k, v)

    call()  # warm-up: lazy initialisation stays out of the numbers
    if what == "memory":
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # reset VmHWM to the current RSS
        baseline = _status_kib("VmRSS")
        call()
        return max(_status_kib("VmHWM") - baseline, 0) / 1024
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def run_child(
    kernel_name: str, n: int, what: str, repeats: int, backward: bool, threads: int
) -> float | None:
    """One measurement in a fresh process; None if it failed (e.g. killed for memory)."""
    command = [
        sys.executable,
        __file__,
        "--child",
        kernel_name,
        str(n),
        what,
        "--repeats",
        str(repeats),
        "--threads",
        str(threads),
    ]
    if backward:
        command.append("--backward")
    env = dict(os.environ)
    if what == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        print(
            f"{kernel_name} n={n} {what} failed ({result.returncode}): {result.stderr.strip()[-300:]}",
            file=sys.stderr,
        )
        return None
    return float(result.stdout.strip().splitlines()[-1])


def fit_lengths(lengths: list[int]) -> list[int]:
    """The lengths the growth exponent is fitted over: n >= 1024, else the upper half (at least two)."""
    upper = [n for n in lengths if n >= 1024]
    return upper if len(upper) >= 2 else lengths[min(len(lengths) // 2, len(lengths) - 2) :]


def growth_exponent(lengths: list[int], values: list[float | None]) -> float | None:
    """Least-squares slope of log(value) on log(n) over `fit_lengths`; None without two positive points."""
    fit = fit_lengths(lengths)
    points = [
        (math.log(n), math.log(y)) for n, y in zip(lengths, values, strict=True) if n in fit and y and y > 0
    ]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(
    results: dict[str, dict[int, dict[str, float | None]]], lengths: list[int], backward: bool, threads: int
) -> None:
    """Print the table, the growth exponents and the goals."""
    mode = "forward + backward" if backward else "forward, no_grad"
    print(
        f"attention kernels on CPU ({threads} thread{'s' * (threads > 1)}): batch {BATCH}, {HEADS} heads, "
        f"d_model {D_MODEL}, not causal, {mode}"
    )
    print(f"{'kernel':<8}{'n':>6}{'time ms':>11}{'x math':>8}{'peak MiB':>11}{'x math':>8}")

    def get(kernel: str, n: int, key: str) -> float | None:
        return results.get(kernel, {}).get(n, {}).get(key)

    def ratio(kernel: str, n: int, key: str) -> float | None:
        ours, base = get(kernel, n, key), get("math", n, key)
        return None if ours is None or not base else ours / base

    for kernel in results:
        for n in lengths:
            print(
                f"{kernel:<8}{n:>6}{fmt(get(kernel, n, 'ms'), '.2f'):>11}"
                f"{fmt(ratio(kernel, n, 'ms'), '.3f'):>8}"
                f"{fmt(get(kernel, n, 'mib'), '.1f'):>11}{fmt(ratio(kernel, n, 'mib'), '.3f'):>8}"
            )
    exponents = {
        kernel: {
            key: growth_exponent(lengths, [get(kernel, n, key) for n in lengths]) for key in ("ms", "mib")
        }
        for kernel in results
    }
    fit = fit_lengths(lengths)
    print(f"\ngrowth exponent (slope of log value vs log n, n = {fit[0]}..{fit[-1]})")
    print(f"{'kernel':<8}{'time':>8}{'memory':>8}")
    for kernel, exponent in exponents.items():
        print(f"{kernel:<8}{fmt(exponent['ms'], '.2f'):>8}{fmt(exponent['mib'], '.2f'):>8}")

    print("\ngoals")
    linear = exponents.get("linear", {})
    for key, what in (("ms", "time"), ("mib", "memory")):
        value = linear.get(key)
        verdict = "-" if value is None else ("ok" if value <= 1.15 else "MISSED")
        print(f"  linear {what} exponent {fmt(value, '.2f')} <= 1.15: {verdict}")
    top = max(lengths)
    share = ratio("linear", top, "mib")
    verdict = "-" if share is None else ("ok" if share < 0.1 else "MISSED")
    print(f"  linear memory at {top} = {fmt(share, '.4f')} of math's < 0.1: {verdict}")
    if 2048 in lengths:
        speed = ratio("sdpa", 2048, "ms")
        speedup = None if not speed else 1 / speed
        verdict = "-" if speedup is None else ("ok" if speedup >= 2 else "MISSED")
        print(f"  sdpa speed-up over math at 2048 = {fmt(speedup, '.2f')}x >= 2: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-len", type=int, default=max(LENGTHS), help="longest sequence length (default 8192)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--backward", action="store_true", help="time forward + backward instead")
    parser.add_argument("--kernels", nargs="+", default=list(KERNEL_NAMES), choices=KERNEL_NAMES)
    parser.add_argument("--child", nargs=3, metavar=("KERNEL", "N", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kernel, n, what = args.child
        print(measure(kernel, int(n), what, args.repeats, args.backward, args.threads))
        return
    lengths = [n for n in LENGTHS if n <= args.max_len]
    results = {
        kernel: {
            n: {
                key: run_child(kernel, n, what, args.repeats, args.backward, args.threads)
                for key, what in KEYS.items()
            }
            for n in lengths
        }
        for kernel in args.kernels
    }
    report(results, lengths, args.backward, args.threads)


if __name__ == "__main__":
    main()

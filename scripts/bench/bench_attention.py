"""Time and peak memory of the attention kernels on the CPU against sequence length (``attnmt.study.growth``).

Encoder self-attention, no mask, not causal: batch 1, 4 heads, d_model 256 (d_head 64), forward under
torch.no_grad and forward + backward, each (kernel, length, mode, time or memory) in a fresh child process;
how each is measured is in ``attnmt/study/growth.py``. The growth exponent is the slope of log(value)
on log(n) over n >= 1024, printed beside the exponent the tutorials claim (within 0.25: ok).

    python scripts/bench/bench_attention.py                          # every kernel, 64 .. 8192
    python scripts/bench/bench_attention.py --max-len 1024 --repeats 2 --kernels math linear
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from scriptargs import Number, ScriptParser, guarded

from attnmt.study.growth import (
    CLAIMED,
    COMPLEXITY,
    LENGTHS,
    MODES,
    claimed_within,
    fit_lengths,
    measure_growth,
)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(growth) -> None:
    """The table (ratios to math at the same length), the exponents beside the claims, and the goals."""
    values, lengths = growth.values, growth.lengths
    print(f"attention kernels on the CPU ({growth.threads} thread(s)): batch 1, 4 heads, d_model 256, "
          "not causal")
    for mode in MODES:
        print(f"\n{mode}\n{'kernel':<10}{'n':>6}{'time ms':>11}{'x math':>8}{'peak MiB':>11}{'x math':>8}")
        for kernel in values:
            for i, n in enumerate(lengths):
                ms, mib = values[kernel][mode]["ms"][i], values[kernel][mode]["mib"][i]
                base = values.get("math", {}).get(mode, {})
                ms_ratio = ms / base["ms"][i] if base and ms and base["ms"][i] else None
                mib_ratio = mib / base["mib"][i] if base and mib is not None and base["mib"][i] else None
                print(f"{kernel:<10}{n:>6}{fmt(ms, '.2f'):>11}{fmt(ms_ratio, '.3f'):>8}{fmt(mib, '.1f'):>11}"
                      f"{fmt(mib_ratio, '.3f'):>8}")
    fit = fit_lengths(lengths)
    print(f"\ngrowth exponents (fitted over n = {fit[0]}..{fit[-1]})")
    print(f"{'kernel':<10}{'claimed':>12}{'time':>7}{'fwd+bwd':>9}{'memory':>8}{'fwd+bwd':>9}  "
          "time within 0.25")
    for kernel in values:
        time_fwd = growth.exponent(kernel, "forward", "ms")
        verdict = "-" if time_fwd is None else ("ok" if claimed_within(kernel, time_fwd) else "MISSED")
        print(f"{kernel:<10}{COMPLEXITY[CLAIMED[kernel][0]]:>12}{fmt(time_fwd, '.2f'):>7}"
              f"{fmt(growth.exponent(kernel, 'backward', 'ms'), '.2f'):>9}"
              f"{fmt(growth.exponent(kernel, 'forward', 'mib'), '.2f'):>8}"
              f"{fmt(growth.exponent(kernel, 'backward', 'mib'), '.2f'):>9}  {verdict}")


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=Number(int, low=min(LENGTHS)), default=max(LENGTHS),
                        help="longest length (default 8192)")
    parser.add_argument("--repeats", type=Number(int, low=1), default=3,
                        help="timed calls per measurement (default 3)")
    parser.add_argument("--threads", type=Number(int, low=1), default=1,
                        help="torch intra-op threads (default 1)")
    parser.add_argument("--kernels", nargs="+", default=list(CLAIMED), choices=list(CLAIMED))
    return parser


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    lengths = [n for n in LENGTHS if n <= args.max_len]
    growth = measure_growth(args.kernels, lengths, args.repeats, args.threads,
                            on_done=lambda label: print(label, file=sys.stderr, flush=True))
    report(growth)


if __name__ == "__main__":
    main()

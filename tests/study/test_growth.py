"""No growth over time, the short version of ``scripts/check_growth.py`` (whose sampler these tests use):
``attnmt train`` validating, saving and pruning every 20 steps for 400 steps, and ``attnmt translate``
streaming 5,000 lines from a pipe, each process sampled from ``/proc`` (resident memory, open file
descriptors, threads) and tagged with the work done. The medians just after step 100 and just before step
400 (just after 1,000 lines and just before 5,000) are compared.

Limits, and why: memory may grow by max(5%, 20 MB), about 22 MB. On the 2-core machine (2026-12) the
medians moved by +0.5 to +0.7 MB over 400 steps (3 runs), +2.1 MB over 2,000 and +4.9 MB over 10,000
(sacrebleu's and rich's bounded string caches filling, per tracemalloc; attnmt's object count stays
flat), and by +0.9 to +1.6 MB over 5,000 lines with oneDNN's caches pinned (below; +1.5 MB over 100,000).
So 20 MB is over 10 times the noise, while most of the ~445 MB of a training process is torch's
libraries, which a relative limit of 15% (67 MB) would hand to a leak. File descriptors and threads must
stay equal or grow by 2 at most. A leaking variant of the command line (patched in a launcher) fails these
tests: 128 KB kept per step (+31 MB), one file handle or one thread per validation (+12), 8 MB kept or one
file handle per chunk of 1,000 lines (+25 MB, +3 fds); 64 KB a step and 4 MB a chunk pass, which is the
floor of what memory sampling can see in runs this short.

The translation test runs with oneDNN's caches as they are. They used to be the one thing that grew: the
decoding fast path's ``_linear_pointwise`` added a compiled kernel for each new number of rows (1,775
shapes in 20,000 lines), which took a streaming translate from about 270 MB to about 950 MB before it
levelled off; ``fastpath.row_bucket`` now rounds the rows to a few sizes (358 to 365 MB over 30,000 lines).
"""

from __future__ import annotations

import pytest
from helpers import load_script

growth = load_script("check_growth")

RSS = growth.Limit(0.05, 20.0)  # MB
COUNTS = growth.Limit(0.0, 2)  # file descriptors, threads
INTERVAL = 0.05  # s: the tiny model trains about 130 steps a second
STEPS, EVERY, FIRST_STEP, STEP_SPAN = 400, 20, 100, 50
LINES, FIRST_LINE, LINE_SPAN = 5000, 1000, 1000  # the output comes 1,000 lines at a time


def explain(m) -> str:
    return "\n".join(m.failures()) + "\n" + growth.table([m])


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """The tiny config trained for 400 steps, sampled all along: (run folder, measurement)."""
    run = tiny.copy_prepared(tmp_path_factory.mktemp("growth") / "run")
    measured = growth.measure_training(tiny.config["transformer"], run, STEPS, EVERY, FIRST_STEP, INTERVAL,
                                       STEP_SPAN, RSS, COUNTS, timeout=300)
    return run, measured


def test_training_does_not_grow(trained):
    _, m = trained
    assert m.returncode == 0, explain(m)
    assert all(p.n >= growth.NEAREST for p in m.points)
    assert m.ok, explain(m)


def test_translate_stream_does_not_grow(trained):
    run, train = trained
    assert train.returncode == 0, explain(train)
    m = growth.measure_translate(run, LINES, FIRST_LINE, INTERVAL, LINE_SPAN, RSS, COUNTS, timeout=300)
    assert m.returncode == 0, explain(m)
    assert m.ok, explain(m)

"""No growth over time: the resident memory, open file descriptors and threads of ``attnmt train`` and of a
streaming ``attnmt translate`` must level off, not climb with the work done.

    python scripts/check_growth.py --steps 2000 --lines 100000 --out growth.json

(a) Training: the tiny toy config of ``tests/helpers.py`` (one layer each side, d_model 16; the toy data is
generated, offline) trained for ``--steps`` small steps in a subprocess, validating, saving and pruning every
``--every`` steps (keep_last 2, keep_best 2). A sampler thread reads the process's ``/proc/PID/status``
(VmRSS, Threads) and counts ``/proc/PID/fd`` every ``--interval`` seconds, each sample tagged with the last
step in ``RUN/metrics.jsonl`` (logged every 5 steps). The tiny model trains over 100 steps a second on one
core, so the default interval is 0.1 s rather than the 0.5 s a bigger model would allow: a few samples fall
near every step compared.
(b) Translation: the model just trained, ``attnmt translate RUN --beam-size 1`` reading ``--lines`` random
toy source lines from a pipe (a writer thread feeds stdin, a reader thread counts the lines of stdout),
sampled the same way, each sample tagged with the lines translated so far.

Each quantity is the median of the samples at a point: for the first point those taken with the progress
(step or lines) from it up to ``--span`` times it further, for the last point as far up to it, not at it:
steps 200..299 and 1,900..1,999 of 2,000; lines 10,000..14,999 and 95,000..99,999 of 100,000 (at least
1,000 lines: the output comes 1,000 at a time). Never a sample during start-up or winding down.
Compared: training at step ``--steps // 10`` (at least 100) and at ``--steps``; translation at
``--lines // 10`` and at ``--lines``. Limits, as growth allowed over the first point: memory 10%
(``--rss-limit``), file descriptors and threads 10% or 2, whichever is more (the counts are small).
Shrinking is never a failure. A profile line gives the median memory in each tenth of the work, to tell
a climb from a step that levels off.

Known growth (2026-12, the 2-core machine): translation climbs from about 270 MB to about 950 MB over the
first ~20,000 lines, then levels off. It is not attnmt's objects but oneDNN's primitive cache and ideep's
computation cache (1,024 entries each by default, keyed by shape), which the decoding fast path's
``_linear_pointwise`` (``attnmt/decoding/fastpath.py``) fills with an entry for every new number of rows:
``--pin-caches`` caps both, and then 100,000 lines grow by 1.5 MB. The full run passes regardless (by line
10,000 the caches are mostly full); a shorter ``--lines`` measures its first point before that and fails.
``--model RUN`` translates an existing checkpoint or run folder without training.

Prints a table, writes every sample and the verdicts to ``--out`` (JSON), and exits 1 when a limit is
exceeded (2 when a command fails). ``--launcher FILE`` runs ``python FILE ARGS`` in place of
``python -m attnmt ARGS`` (a variant of the command line that leaks on purpose, to see this check fail).
``tests/study/test_growth.py`` runs a short version of both with the functions here.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import OFFLINE_ENV, write_tiny_config  # noqa: E402  (the tiny config the tests train)
from scriptargs import InputFile, Model, Number, OutputFile, OutputFolder, ScriptParser, guarded  # noqa: E402

NEAREST = 5  # samples taken when fewer fall inside the window
# oneDNN's primitive cache and ideep's computation cache, both keyed by shape, 1,024 entries by default;
# decoding's fast path (attnmt/decoding/fastpath.py) fills them: --pin-caches caps them, to see attnmt's
# own growth.
SMALL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8", "LRU_CACHE_CAPACITY": "8"}
METRICS_EVERY = 5  # train.log_every: the step resolution of the samples


# ------------------------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    t: float  # seconds since the process started
    progress: int  # the step trained, or the lines translated, when the sample was taken
    rss_kb: int
    threads: int
    fds: int


def read_proc(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS in kB, threads, open file descriptors) of a live process; None once it has exited (a zombie
    has no VmRSS) or cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:
        return None
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"]), fds


class Sampler:
    """A daemon thread sampling ``pid`` every ``interval`` seconds until stopped or the process is gone;
    ``progress()`` tags each sample (read just before the process, so a sample is never credited with work
    done after it)."""

    def __init__(self, pid: int, progress: Callable[[], int], interval: float) -> None:
        self.pid, self.progress, self.interval = pid, progress, interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="growth-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            done = self.progress()
            read = read_proc(self.pid)
            if read is None:
                return
            self.samples.append(Sample(round(time.monotonic() - self._start, 3), done, *read))
            self._stop.wait(self.interval)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples


class MetricsStep:
    """The step of the last record in a run's ``metrics.jsonl`` (0 before there is one), read
    incrementally."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.step, self.rest = path, 0, 0, b""

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return self.step
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            try:
                self.step = max(self.step, int(json.loads(line).get("step", 0)))
            except (ValueError, AttributeError, TypeError):
                continue
        return self.step


# -------------------------------------------------------------------------------------------- verdicts


@dataclass
class Limit:
    """Growth allowed over the first point: the larger of ``rel`` of its value and ``abs`` units."""

    rel: float
    abs: float = 0.0

    def allowed(self, base: float) -> float:
        return max(self.rel * base, self.abs)


@dataclass
class Point:
    at: int
    n: int  # samples the medians are taken over
    progress: tuple[int, int]  # the least and the most progress among them
    rss_mb: float
    fds: float
    threads: float


def between(samples: list[Sample], lo: int, hi: int, end: int) -> list[Sample]:
    """The samples whose progress is in [lo, hi), or, when fewer than ``NEAREST`` are, the ``NEAREST``
    nearest to that range's middle. Never one at progress 0 (start-up: the work has not begun) or at
    ``end`` (the process may be winding down: closing its log, joining threads)."""
    working = [s for s in samples if 0 < s.progress < end]
    inside = [s for s in working if lo <= s.progress < hi]
    if len(inside) >= NEAREST:
        return inside
    middle = (lo + hi) / 2
    return sorted(working, key=lambda s: (abs(s.progress - middle), s.t))[:NEAREST]


def point(samples: list[Sample], at: int, lo: int, hi: int, end: int) -> Point:
    """Medians of the samples from ``lo`` up to ``hi``, reported as the point ``at``."""
    chosen = between(samples, lo, hi, end)
    if not chosen:
        raise RuntimeError(f"no samples near {at:,}: the process was not sampled while it worked")
    return Point(at, len(chosen), (min(s.progress for s in chosen), max(s.progress for s in chosen)),
                 round(statistics.median(s.rss_kb for s in chosen) / 1024, 1),
                 statistics.median(s.fds for s in chosen), statistics.median(s.threads for s in chosen))


@dataclass
class Check:
    quantity: str
    first: float
    last: float
    allowed: float  # growth allowed
    ok: bool


@dataclass
class Measured:
    what: str
    unit: str  # what progress counts: "step" or "line"
    command: list[str]
    returncode: int
    wall_s: float
    points: list[Point]
    checks: list[Check]
    peak_rss_mb: float
    samples: list[Sample] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        out = [f"{self.what}: exit {self.returncode}"] if self.returncode else []
        a, b = self.points
        out += [f"{self.what} {c.quantity}: {c.first:g} at {self.unit} {a.at:,} -> {c.last:g} at "
                f"{self.unit} {b.at:,} (growth allowed {c.allowed:.3g})" for c in self.checks if not c.ok]
        return out


def judge(what: str, unit: str, command: list[str], returncode: int, wall_s: float, samples: list[Sample],
          first: int, last: int, span: int, rss: Limit, counts: Limit) -> Measured:
    """Medians of the samples just after ``first`` (progress in [first, first + span)) and just before
    ``last`` ([last - span, last)), each quantity checked against its limit."""
    a, b = point(samples, first, first, first + span, last), point(samples, last, last - span, last, last)
    checks = []
    for quantity, limit in (("rss_mb", rss), ("fds", counts), ("threads", counts)):
        x, y = getattr(a, quantity), getattr(b, quantity)
        allowed = limit.allowed(x)
        checks.append(Check(quantity, x, y, round(allowed, 2), y - x <= allowed))
    peak = round(max(s.rss_kb for s in samples) / 1024, 1)
    return Measured(what, unit, command, returncode, wall_s, [a, b], checks, peak, samples)


# ---------------------------------------------------------------------------------------- the commands


def attnmt_command(launcher: Path | None) -> list[str]:
    return [sys.executable, str(launcher)] if launcher else [sys.executable, "-m", "attnmt"]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Offline, one thread (as the tests run attnmt), and ``extra``."""
    return {**os.environ, **OFFLINE_ENV, **(extra or {})}


def train_sets(steps: int, every: int) -> list[str]:
    return [f"train.max_steps={steps}", "train.max_epochs=1000000", f"train.eval_every={every}",
            f"train.save_every={every}", "train.keep_last=2", "train.keep_best=2",
            f"train.log_every={METRICS_EVERY}"]


def measure_training(config: Path, run_dir: Path, steps: int, every: int, first: int, interval: float,
                     span: int, rss: Limit, counts: Limit, launcher: Path | None = None,
                     extra_env: dict[str, str] | None = None, timeout: float = 1800) -> Measured:
    """Train ``config`` into ``run_dir`` (prepared there first if it is not) for ``steps`` steps, sampled."""
    command = [*attnmt_command(launcher), "train", str(config), "--run-dir", str(run_dir)]
    for item in train_sets(steps, every):
        command += ["--set", item]
    log = run_dir.parent / f"{run_dir.name}.train.log"
    with open(log, "wb") as out:
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO, env=env(extra_env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
        trained = MetricsStep(run_dir / "metrics.jsonl")
        sampler = Sampler(proc.pid, trained, interval)
        returncode = wait_or_kill(proc, timeout)
        wall = round(time.monotonic() - start, 2)
        samples = sampler.stop()
    if returncode or trained() != steps:
        sys.stderr.write(log.read_text(encoding="utf-8", errors="replace")[-3000:])
        sys.stderr.write(f"train: stopped at step {trained():,} of {steps:,}\n")
        returncode = returncode or 2  # stopping short is a failure of its own
    return judge("train", "step", command, returncode, wall, samples, first, steps, span, rss, counts)


def wait_or_kill(proc: subprocess.Popen, timeout: float) -> int:
    """The process's exit status; killed if it is still running when ``timeout`` runs out (or on error)."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def toy_sources(n: int, seed: int = 7) -> Iterator[str]:
    """``n`` random toy source lines (repeats allowed), as the toy task draws them."""
    from attnmt.data.toy import toy_pair

    rng = random.Random(seed)
    for _ in range(n):
        yield toy_pair(rng)[0]


def measure_translate(model: Path, lines: int, first: int, interval: float, span: int, rss: Limit,
                      counts: Limit, launcher: Path | None = None, source: Iterable[str] | None = None,
                      extra_env: dict[str, str] | None = None, timeout: float = 1800) -> Measured:
    """``attnmt translate MODEL --beam-size 1`` fed ``lines`` lines through a pipe, sampled by lines out."""
    command = [*attnmt_command(launcher), "translate", str(model), "--beam-size", "1"]
    source = toy_sources(lines) if source is None else source
    done = [0]
    errors: list[BaseException] = []
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, env=env(extra_env), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def write() -> None:
        try:
            batch = []
            for line in source:
                batch.append(line.encode("utf-8") + b"\n")
                if len(batch) == 500:
                    proc.stdin.write(b"".join(batch))
                    batch = []
            proc.stdin.write(b"".join(batch))
            proc.stdin.close()
        except (BrokenPipeError, ValueError) as e:  # the process died; its exit status tells
            errors.append(e)

    def read() -> None:
        for _ in proc.stdout:
            done[0] += 1

    stderr: list[bytes] = []
    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=read, daemon=True),
               threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)]
    for thread in threads:
        thread.start()
    sampler = Sampler(proc.pid, lambda: done[0], interval)
    returncode = wait_or_kill(proc, timeout)
    wall = round(time.monotonic() - start, 2)
    samples = sampler.stop()
    for thread in threads:
        thread.join(timeout=10)
    if returncode or done[0] != lines:
        sys.stderr.write(b"".join(stderr).decode("utf-8", "replace")[-3000:])
        returncode = returncode or 2  # fewer lines out than in is a failure of its own
        sys.stderr.write(f"translate: {done[0]:,} lines out of {lines:,}\n")
    return judge("translate", "line", command, returncode, wall, samples, first, lines, span, rss, counts)


# ------------------------------------------------------------------------------------------------ main


def profile(m: Measured, parts: int = 10) -> list[tuple[int, float]]:
    """(progress, median RSS in MB) of each ``parts``-th of the work, for the samples taken while working."""
    last = m.points[-1].at
    out = []
    for i in range(parts):
        lo, hi = last * i // parts, last * (i + 1) // parts
        rss = [s.rss_kb for s in m.samples if 0 < s.progress < last and lo <= s.progress < hi]
        if rss:
            out.append((hi, round(statistics.median(rss) / 1024, 1)))
    return out


def table(results: list[Measured]) -> str:
    rows = ["| process | at | samples (of progress) | RSS MB | fds | threads | wall s |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in results:
        for p in m.points:
            rows.append(f"| {m.what} | {m.unit} {p.at:,} | {p.n} ({p.progress[0]:,}..{p.progress[1]:,}) "
                        f"| {p.rss_mb:.1f} | {p.fds:g} | {p.threads:g} | {m.wall_s:.1f} |")
    rows.append("")
    for m in results:
        verdicts = ", ".join(f"{c.quantity} {c.last - c.first:+.3g} (allowed +{c.allowed:.3g}) "
                             f"{'ok' if c.ok else 'GREW'}" for c in m.checks)
        rows.append(f"{m.what}: {verdicts}; peak RSS {m.peak_rss_mb:.1f} MB")
        rows.append(f"  RSS MB by {m.unit}: " + ", ".join(f"{at:,}: {mb:.0f}" for at, mb in profile(m)))
    return "\n".join(rows)


def report(results: list[Measured], args: dict) -> dict:
    return {"args": args, "ok": all(m.ok for m in results),
            **{m.what: {**{k: v for k, v in asdict(m).items() if k != "samples"}, "ok": m.ok,
                    "rss_profile_mb": profile(m),
                        "samples": [[s.t, s.progress, s.rss_kb, s.threads, s.fds] for s in m.samples],
                        "sample_fields": ["t", "progress", "rss_kb", "threads", "fds"]} for m in results}}


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=Number(int, low=20), default=2000,
                        help="training steps (default 2000)")
    parser.add_argument("--every", type=Number(int, low=1), default=50,
                        help="validate, save and prune every N steps")
    parser.add_argument("--lines", type=Number(int, low=0), default=100_000,
                        help="lines to translate (default 100000; 0: no translation)")
    parser.add_argument("--interval", type=Number(float, above=0), default=0.1,
                        help="seconds between samples")
    parser.add_argument("--span", type=Number(float, above=0), default=0.5,
                        help="a point's samples span this fraction of the first point's value (default 0.5: "
                             "steps 200..299 and 1900..1999)")
    parser.add_argument("--rss-limit", type=Number(float, low=0), default=0.10,
                        help="memory growth allowed (fraction)")
    parser.add_argument("--work", type=OutputFolder(), help="keep the run folder here (default a temporary "
                        "folder)")
    parser.add_argument("--out", type=OutputFile(), help="write the report (JSON, with every sample) here")
    parser.add_argument("--launcher", type=InputFile(), help="a Python file to run in place of `-m attnmt`")
    parser.add_argument("--pin-caches", action="store_true", help="translate with oneDNN's shape caches "
                        "capped at 8 entries (on the tiny model they fill to about 700 MB, then level off)")
    parser.add_argument("--model", type=Model(exports=True),
                        help="translate this checkpoint or run folder; no training")
    return parser


@guarded
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rss, counts = Limit(args.rss_limit), Limit(0.10, 2)
    # absolute: the commands run in the repository
    model, launcher = (path.resolve() if path else None for path in (args.model, args.launcher))
    with tempfile.TemporaryDirectory(prefix="attnmt-growth-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        config = write_tiny_config(work / "tiny.yaml")
        run_dir = work / "run"
        first = max(100, args.steps // 10) if args.steps >= 200 else args.steps // 4
        results = [] if model else [
            measure_training(config, run_dir, args.steps, args.every, first, args.interval,
                             int(args.span * first), rss, counts, launcher)]
        if args.lines and not any(m.returncode for m in results):
            first_line = max(1, args.lines // 10)
            span = max(1000, int(args.span * first_line))  # the output comes 1,000 lines at a time
            results.append(measure_translate(model or run_dir, args.lines, first_line, args.interval,
                                             span, rss, counts, launcher,
                                             extra_env=SMALL_CACHES if args.pin_caches else None))
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(report(results, {k: str(v) for k, v in vars(args).items()}),
                                       indent=1) + "\n", encoding="utf-8")
    failures = [f for m in results for f in m.failures()]
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    if any(m.returncode for m in results):
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

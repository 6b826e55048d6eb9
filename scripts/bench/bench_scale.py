"""How prepare and training grow with the corpus: wall time and peak memory against the number of pairs.

    python scripts/bench/bench_scale.py --sizes 100000 1000000 5000000 10000000
    python scripts/bench/bench_scale.py --sizes 20000 40000 80000 --steps 20      # a quick look

For each size, a de-en corpus of that many distinct pairs is written as plain text (Multi30k's training
sentences, from ``--data``, repeated with a running number appended to both sides so that no two pairs
are the same), then, one process at a time:

- ``attnmt prepare`` with the Multi30k Transformer recipe (its tokenizer samples at most
  ``tokenizer.sample_size`` sentences) and ``--workers``: wall time, peak resident memory of the main
  process (``os.wait4``'s ``ru_maxrss``) and of the whole process tree (its workers too: the largest sum
  of their ``VmRSS`` sampled every 50 ms);
- ``attnmt train`` for ``--steps`` steps with validation and saving pushed past the end: the seconds to the
  first logged step, the resident memory when the last logged step appears (all of it, and the anonymous
  part: without the pages of mapped files, the split's arrays among them), steps per second after the
  first step, and the peak resident memory.

It prints a table and, for each measure, the exponent b of the least-squares fit measure ~ size^b over the
sizes (1: linear; 0: independent of the corpus).
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO
from scriptargs import ConfigFile, InputFolder, Number, ScriptParser, guarded

from attnmt.errors import DataError

RECIPE = REPO / "configs" / "multi30k_de_en_transformer.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def write_corpus(data: Path, size: int, out: Path) -> tuple[Path, Path]:
    """``size`` distinct de-en pairs made from Multi30k's training sentences, as two text files."""
    with gzip.open(data / "train.de.gz", "rt", encoding="utf-8") as de, \
            gzip.open(data / "train.en.gz", "rt", encoding="utf-8") as en:
        pairs = [(d.rstrip("\n"), e.rstrip("\n")) for d, e in zip(de, en)]
    src, tgt = out / f"train{size}.de", out / f"train{size}.en"
    with open(src, "w", encoding="utf-8") as s, open(tgt, "w", encoding="utf-8") as t:
        for k, (d, e) in zip(range(size), itertools.cycle(pairs)):
            copy = k // len(pairs)
            s.write(f"{d} {copy}\n" if copy else f"{d}\n")
            t.write(f"{e} {copy}\n" if copy else f"{e}\n")
    return src, tgt


def run(args: list[str], watch: Path | None = None, steps: int = 0) -> dict:
    """``python -m attnmt ARGS`` as one child: wall seconds and peak RSS (MB); with ``watch`` (a
    metrics.jsonl), the seconds to its first train record and the RSS (MB) when the record of ``steps``
    appears."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "attnmt", *args], env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    first = last_rss = last_anon = None
    tree_peak = 0.0
    while True:  # wait4, not poll: its rusage is this child's alone
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        tree_peak = max(tree_peak, sum(_rss_mb(p) or 0.0 for p in _tree(process.pid)))
        records = _records(watch) if watch is not None else []
        if records and first is None:
            first = time.perf_counter() - started
        if records and records[-1]["step"] >= steps and last_rss is None:
            last_rss, last_anon = _rss_mb(process.pid), _rss_mb(process.pid, "RssAnon")
        time.sleep(0.05)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"attnmt {' '.join(args[:1])} failed: {process.stderr.read().decode()[-2000:]}")
    result = {"seconds": time.perf_counter() - started, "peak_mb": usage.ru_maxrss / 1024,
              "tree_peak_mb": max(tree_peak, usage.ru_maxrss / 1024)}
    if watch is not None:
        records = _records(watch)
        span = records[-1]["elapsed_s"] - records[0]["elapsed_s"] if len(records) > 1 else float("nan")
        result.update(first_step_s=first, rss_at_end_mb=last_rss, anon_at_end_mb=last_anon,
                      steps_per_s=(records[-1]["step"] - records[0]["step"]) / span if span else float("nan"))
    return result


def _records(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if record.get("event") == "train":
            records.append(record)
    return records


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/PID/task/*/children``."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
            except OSError:
                pass
    return found


def _rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """A memory field of ``/proc/PID/status`` in MB: VmRSS, or RssAnon (the process's own memory, without
    the pages of mapped files, which the kernel can drop and read again)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((x for x in status.splitlines() if x.startswith(f"{field}:")), None)
    return int(line.split()[1]) / 1024 if line else None


def exponent(sizes: list[int], values: list[float]) -> float:
    """b of the least-squares fit of log(value) = a + b log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=Number(int, low=1), nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--steps", type=Number(int, low=1), default=50, help="training steps at each size")
    ap.add_argument("--data", type=InputFolder(), default=REPO.parent / "shared" / "data" / "multi30k",
                    help="a folder with Multi30k's train.de.gz and train.en.gz")
    ap.add_argument("--config", type=ConfigFile(), default=RECIPE)
    ap.add_argument("--workers", type=Number(int, low=1), default=None,
                    help="prepare's --workers (default: its own)")
    ap.add_argument("--keep", action="store_true", help="keep the corpora and run folders")
    ap.checks.append(check_data)
    return ap


def check_data(args) -> None:
    missing = [name for name in ("train.de.gz", "train.en.gz") if not (args.data / name).is_file()]
    if missing:
        raise DataError(f"--data {args.data}: no {', '.join(missing)} in it")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="attnmt-scale-"))
    rows = []
    try:
        for size in sorted(args.sizes):
            src, tgt = write_corpus(args.data, size, work)
            run_dir = work / f"run{size}"
            sets = ["--set", f"data.train.src={src}", "--set", f"data.train.tgt={tgt}"]
            workers = ["--workers", str(args.workers)] if args.workers else []
            prepared = run(["prepare", str(args.config), "--run-dir", str(run_dir), *sets, *workers])
            trained = run(["train", str(args.config), "--run-dir", str(run_dir), *sets,
                           "--set", f"train.max_steps={args.steps}", "--set", "train.log_every=1",
                           "--set", "train.eval_every=1000000", "--set", "train.save_every=1000000",
                           "--set", "train.average_last=0", "--set", "train.max_minutes=0"],
                          watch=run_dir / "metrics.jsonl", steps=args.steps)
            rows.append((size, prepared, trained))
            line = (f"{size:>11,} pairs: prepare {prepared['seconds']:.1f} s,"
                    f" peak {prepared['peak_mb']:,.0f} MB"
                    f" (with its workers {prepared['tree_peak_mb']:,.0f} MB);"
                    f" train: first step after"
                    f" {trained['first_step_s']:.1f} s, {trained['steps_per_s']:.2f} steps/s,"
                    f" RSS at step {args.steps} {trained['rss_at_end_mb'] or float('nan'):,.0f} MB"
                    f" (anonymous {trained['anon_at_end_mb'] or float('nan'):,.0f} MB),"
                    f" peak {trained['peak_mb']:,.0f} MB")
            print(line, flush=True)
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
                src.unlink()
                tgt.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    measures = [("prepare s", lambda p, t: p["seconds"]), ("prepare peak MB", lambda p, t: p["peak_mb"]),
                ("prepare peak MB, with workers", lambda p, t: p["tree_peak_mb"]),
                ("train first step s", lambda p, t: t["first_step_s"]),
                ("train RSS MB", lambda p, t: t["rss_at_end_mb"]),
                ("train anonymous RSS MB", lambda p, t: t["anon_at_end_mb"]),
                ("train peak MB", lambda p, t: t["peak_mb"])]
    print("\n| measure | " + " | ".join(f"{s:,}" for s, _, _ in rows) + " | exponent |")
    print("| --- |" + " --- |" * (len(rows) + 1))
    for name, get in measures:
        values = [get(p, t) for _, p, t in rows]
        fit = exponent([s for s, _, _ in rows], values) if len(rows) > 1 and all(values) else float("nan")
        print(f"| {name} | " + " | ".join(f"{v:,.1f}" for v in values) + f" | {fit:.2f} |")


if __name__ == "__main__":
    main()

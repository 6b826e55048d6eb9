"""What the benchmarks share: the repository's root (``REPO``), and for the training benchmarks
(``bench_sampling.py``, ``bench_multilingual.py``, ``bench_backtranslation.py``) attnmt run in a child
process (``--smoke``: in the benchmark's own, ``in_process``) and the end of a run that writes its results.
What every script shares, the benchmarks and the tools, its arguments' checks and its error guard, is
``scripts/scriptargs.py``: a benchmark puts
``scripts/`` on ``sys.path`` before its imports, so that it runs from any working folder as
``python scripts/bench/bench_NAME.py``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# --smoke, CI's smoke run of a benchmark that trains (tests/scripts/test_scripts_smoke.py): its recipe with
# the smallest model of its architecture, a 100-piece vocabulary and a few steps on the CPU. Its numbers mean
# nothing; every step of the benchmark runs as at full size.
SMOKE_MODEL = {
    "transformer": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 32},
    "lstm": {"emb_dim": 16, "hidden_size": 16, "dec_hidden_size": 16, "attn_dim": 16, "enc_layers": 1,
             "dec_layers": 1},
}
SMOKE_SETTINGS = {
    "tokenizer.vocab_size": 100, "train.max_tokens": 200, "train.warmup_steps": 1, "train.max_steps": 4,
    "train.max_minutes": 0, "train.eval_every": 4, "train.save_every": 4, "train.log_every": 1,
    "train.average_last": 0, "train.device": "cpu", "train.precision": "fp32", "decode.max_len_b": 5,
}  # fmt: skip


def smoke_settings(arch: str) -> dict[str, object]:
    """The dotted keys and values ``--smoke`` sets on a recipe of ``arch``."""
    return {**{f"model.{key}": value for key, value in SMOKE_MODEL[arch].items()}, **SMOKE_SETTINGS}


def smoke_config(config: dict) -> dict:
    """A config (a dict, as read from its YAML) with ``smoke_settings`` set in it; the rest kept."""
    config = json.loads(json.dumps(config))
    for key, value in smoke_settings(config["model"]["arch"]).items():
        *parents, name = key.split(".")
        section = config
        for parent in parents:
            section = section.setdefault(parent, {})
        section[name] = value
    return config


IN_PROCESS = {"on": False}  # set by in_process(): --smoke runs attnmt's commands in this process


def in_process(on: bool) -> None:
    """With ``on`` (a benchmark's ``--smoke``), ``attnmt`` runs each command in this process (``attnmt.cli
    .app`` on the same words, from the same folder) instead of a child: a child's start-up (torch and its
    compiler's imports, then its exit) costs seconds, several times a smoke run's work."""
    IN_PROCESS["on"] = on


def run_here(args: list[str], keep: bool) -> tuple[int, str | None]:
    """``attnmt ARGS`` in this process, from ``REPO`` as a child runs: its exit code, and its stdout when
    ``keep``."""
    from attnmt.cli import app

    out, here = io.StringIO(), Path.cwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out) if keep else contextlib.nullcontext():
            try:
                app(args, prog_name="attnmt")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.chdir(here)
    return code, out.getvalue() if keep else None


def attnmt(*args) -> subprocess.CompletedProcess:
    """``python -m attnmt ARGS`` in a child process (echoed first; ``in_process``: in this one), its output
    shown as it comes (stdout kept for eval); if it fails, the benchmark stops with its exit code: its one
    error line is said."""
    command = [sys.executable, "-m", "attnmt", *map(str, args)]
    print("$", " ".join(command[2:]), flush=True)
    keep = args[0] == "eval"
    if IN_PROCESS["on"]:
        result = subprocess.CompletedProcess(command, *run_here(command[3:], keep))
    else:
        result = subprocess.run(command, cwd=REPO, text=True, stdout=subprocess.PIPE if keep else None)
    if result.returncode != 0:
        sys.exit(result.returncode if result.returncode > 0 else 128 - result.returncode)  # a signal: 128+N
    return result


def eval_scores(run: Path, src: Path, ref: Path, *more) -> dict[str, dict]:
    """``attnmt eval RUN --src --ref`` (BLEU and chrF) as {metric: its JSON record}."""
    found = attnmt("eval", run, "--src", src, "--ref", ref, "--metrics", "bleu,chrf", "--json", *more)
    return {s["metric"]: s for s in json.loads(found.stdout)}


def save_rows(rows: list, path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def run_main(main: Callable[[], None]) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()


def benchmark_in(tree: Path, name: str) -> Path | None:
    """Benchmark ``name`` (``bench_train.py``) in another attnmt checkout ``tree``: ``scripts/bench/NAME``,
    or ``scripts/NAME`` in a checkout from before the benchmarks moved; None when it has neither."""
    return next((path for path in (tree / "scripts" / "bench" / name, tree / "scripts" / name)
                 if path.is_file()), None)

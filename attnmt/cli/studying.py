"""``study``: one model per attention variant on the same data and budget, measured and reported
(``study/run.py``, ``study/measure.py``, ``study/report.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import command
from .contract import Output
from .options import ConfigArg, SetOpt

VARIANTS_HELP = ("Comma-separated: additive, dot, general (LSTM scores); scaled_dot, multihead, sdpa, "
                 "linear, sparse, linformer, performer (Transformer kernels); or all.")


@command(inputs=("config",), outputs={"out": Output(folder=True)})
def study(
    config: ConfigArg,
    variants: Annotated[str, typer.Option("--variants", help=VARIANTS_HELP)] = "all",
    minutes: Annotated[float, typer.Option("--minutes", min=0.01, max=10_000,
                                           help="Training minutes per variant (train.max_minutes).")] = 10.0,
    out: Annotated[Path | None, typer.Option("--out", help="The study folder: new, empty, or a study "
                                             "to go on with (default: studies/<config name>).")] = None,
    set_: SetOpt = None,
    beam_size: Annotated[int, typer.Option("--beam-size", min=1, max=1024,
                                           help="Beam for the dev and test translations.")] = 1,
    growth: Annotated[bool, typer.Option("--growth/--no-growth", help="Measure each kernel's time and "
                                         "memory against length (fresh processes, one thread).")] = True,
    max_len: Annotated[int, typer.Option("--max-len", min=2, max=65536,
                                         help="The longest length the growth is measured at "
                                         "(lengths 64, 128, ... up to it).")] = 8192,
    workers: Annotated[int | None, typer.Option(min=1, max=1024, help="Processes that prepare the data "
                                                "(default: one per core).")] = None,
) -> None:
    """Train one model per attention variant (same data, budget and seed, one after the other) and write
    report.md, report.html and results.json: dev and test BLEU and chrF, BLEU over minutes, training
    tokens/s, decoding sentences/s, peak memory, the kernels' growth with length and one sentence's
    attention under every variant. A finished variant is never trained again: run the same command to go on
    after an interruption, or with more --variants to add some."""
    from ..config.schema import load_config
    from ..study.run import Study, StudyInterrupted, parse_variants, run_study

    names = parse_variants(variants)
    base = load_config(config, set_ or [])
    lengths = [n for n in (2 ** k for k in range(6, 17)) if n <= max_len] or [max_len]
    folder = out if out is not None else Path("studies") / config.stem
    try:
        run_study(Study(folder, base, names, minutes, beam_size), lengths if growth else None, workers,
                  say=lambda line: typer.echo(line, err=True))
    except StudyInterrupted as e:
        sys.stderr.write(f"attnmt: {e}\n")
        raise typer.Exit(e.exit_code) from None
    typer.echo(f"{folder / 'report.html'}")

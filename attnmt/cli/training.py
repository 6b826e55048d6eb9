"""Commands for data and training: ``prepare``, ``toy-data``, ``train``; and the reporter that shows a run."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import command
from .contract import Output
from .options import ConfigArg, RunDirOpt, SetOpt, ToyLanguage

# Pairs per toy split: the task has about two billion sentences, but a toy needs no more than this.
TOY_MAX = 10_000_000


def _load(config: Path, overrides: list[str] | None):
    from ..config import schema as config_module

    return config_module.load_config(config, overrides or [])


def _run_dir(cfg, run_dir: Path | None, name_it: bool):
    """The run folder: --run-dir, else train.run_dir; with ``name_it`` (or --run-dir) the config's
    train.run_dir becomes its resolved path."""
    from ..runfiles import RunDir

    run = RunDir(Path(run_dir) if run_dir is not None else cfg.train.run_dir)
    if name_it or run_dir is not None:
        cfg.train.run_dir = run.root.resolve()
    return run


@command(inputs=("config",), outputs={"run_dir": Output(folder=True, run=True)})
def prepare(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    set_: SetOpt = None,
    workers: Annotated[int | None, typer.Option(
        min=1, max=1024, help="Processes that clean and encode (default: one per core).")] = None,
) -> None:
    """Clean the data, train or load the tokenizer, encode the corpora and print corpus statistics."""
    cfg = _load(config, set_)
    from ..data.prepare import prepare as run_prepare
    from ..runfiles import RunLock

    run = _run_dir(cfg, run_dir, name_it=False)
    with RunLock(run):
        report = run_prepare(cfg, run, workers)
    from .reporting import print_corpus_statistics

    print_corpus_statistics(report)


@command("toy-data", outputs={"out_dir": Output(folder=True)})
def toy_data(
    out_dir: Annotated[Path, typer.Argument(help="Folder to write train/dev/test .en, .de (or .zh and "
                                            ".seg.zh) and .align files into.")],
    train_size: Annotated[int, typer.Option(min=1, max=TOY_MAX,
                                            help="Training pairs, all different.")] = 10000,
    dev_size: Annotated[int, typer.Option(min=1, max=TOY_MAX,
                                          help="Development pairs, all different.")] = 500,
    test_size: Annotated[int, typer.Option(min=1, max=TOY_MAX, help="Test pairs, all different.")] = 500,
    seed: Annotated[int, typer.Option(min=0, max=2**64 - 1, help="The generator's seed: the same seed, "
                                      "sizes and --lang write the same files.")] = 1,
    lang: Annotated[ToyLanguage, typer.Option("--lang", help="The target language.")] = "de",
) -> None:
    """Write the embedded toy task (English -> German or Chinese dates) with its gold word alignments."""
    from ..data.toy import write_toy

    files = write_toy(out_dir, {"train": train_size, "dev": dev_size, "test": test_size}, seed, lang.value)
    typer.echo(f"wrote {len(files)} files to {out_dir}")


@command(inputs=("config",), outputs={"run_dir": Output(folder=True, run=True)})
def train(
    ctx: typer.Context,
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Require a checkpoint to resume from "
                                         "(a run folder with one resumes anyway).")] = False,
) -> None:
    """Train a model from a config; a run folder that has a checkpoint resumes where it stopped."""
    cfg = _load(config, set_)
    from ..runfiles import RunLock
    from ..training.distributed import environment_rank
    from ..training.faults import NO_FAULTS, Faults
    from ..training.runstart import preflight
    from ..training.trainer import Interrupted, fit
    from .reporting import TrainReporter

    preflight(cfg)  # before the run folder is made

    run = _run_dir(cfg, run_dir, name_it=True)
    main_rank = environment_rank() == 0
    faults = ctx.find_object(Faults) or NO_FAULTS  # only tests pass one (tests/fault_run.py)
    try:
        with (RunLock(run) if main_rank else contextlib.nullcontext(),
              TrainReporter(enabled=main_rank) as reporter):
            fit(cfg, run, reporter, resume=resume, faults=faults)
    except Interrupted as e:
        sys.stderr.write(f"attnmt: {e}\n")
        raise typer.Exit(e.exit_code) from None

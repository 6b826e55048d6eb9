"""Commands for data and training: ``prepare``, ``toy-data``, ``train``, ``distill``; and the reporter that
shows a run."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import command
from .contract import Output
from .options import BeamOpt, ConfigArg, Device, MaxTokensOpt, ModelArg, RunDirOpt, SetOpt, ToyLanguage

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


@command(inputs=("teacher", "config", "ensemble"), outputs={"run_dir": Output(folder=True, run=True)})
def distill(
    teacher: ModelArg,
    config: Annotated[Path, typer.Argument(help="The student's YAML config: the teacher translates the "
                                           "sources of its data.train.", show_default=False)],
    run_dir: RunDirOpt = None,
    set_: SetOpt = None,
    ensemble: Annotated[list[Path] | None, typer.Option("--ensemble", help="Another teacher to average with "
                                                        "TEACHER step by step (repeat for more; one "
                                                        "tokenizer).", show_default=False)] = None,
    beam_size: BeamOpt = None,
    max_tokens: MaxTokensOpt = None,
    keep_original: Annotated[bool, typer.Option("--keep-original", help="Train the student on the original "
                                                "corpora too, after the distilled ones.")] = False,
    device: Annotated[Device, typer.Option("--device", help="Where the teacher translates; auto takes CUDA "
                                           "when there is one (the student trains where its train.device "
                                           "says).")] = "auto",
) -> None:
    """Sequence-level knowledge distillation (Kim and Rush 2016): the teacher's translations of the student
    config's training sources go into RUN/distilled, then the student trains on them.

    Stopped, the same command goes on where it stopped: the translating from its last whole chunk, the
    training from its checkpoint. A teacher, beam or corpus other than the one the distilled corpus was
    started with is refused.
    """
    cfg = _load(config, set_)
    from ..decoding.distill import student_config
    from ..runfiles import RunLock
    from ..training.runstart import data_to_prepare, preflight
    from ..training.trainer import Interrupted, fit
    from .reporting import TrainReporter

    run = _run_dir(cfg, run_dir, name_it=True)
    folder = run.distilled.resolve()
    student = student_config(cfg, folder, keep_original, f"{config} (data.train distilled)")
    preflight(student)  # before the run folder is made
    try:
        with RunLock(run), TrainReporter(enabled=True) as reporter:
            data_to_prepare(student, run)  # a run prepared from other data is refused before any translating
            teacher_of = _teacher(teacher, ensemble, beam_size, max_tokens, device)
            _distill_corpora(teacher_of, cfg, folder, reporter)
            del teacher_of  # its memory free before the student is built
            fit(student, run, reporter)
    except KeyboardInterrupt:
        sys.stderr.write(f"attnmt: stopped by SIGINT; the distilled lines in {folder} are kept: run the same "
                         "command again to go on\n")
        raise typer.Exit(130) from None
    except Interrupted as e:
        sys.stderr.write(f"attnmt: {e}\n")
        raise typer.Exit(e.exit_code) from None


def _teacher(model: Path, ensemble: list[Path] | None, beam_size: int | None, max_tokens: int | None, device):
    """``distill``'s teacher: MODEL (and the ensemble) opened for decoding with its decode settings and the
    command line's beam and budget, one output per line."""
    from ..decoding.distill import Teacher
    from ..decoding.translator import DecodeOverrides
    from ..models.checkpoint import resolve_model_path
    from .common import open_translator

    overrides = DecodeOverrides(beam_size, 1, None, max_tokens)
    translator, cfg, path = open_translator(model, device, overrides, ensemble=ensemble)
    return Teacher(translator, cfg.data, (path, *(resolve_model_path(m) for m in ensemble or ())))


def _distill_corpora(teacher, cfg, folder: Path, reporter) -> None:
    """The distilled corpora written (or found complete), with a progress line on a terminal; each said."""
    from ..decoding.distill import distill as distill_corpora
    from ..training.runlog import Message
    from .common import FileProgress

    with FileProgress(None, "distilling") as progress:
        done = distill_corpora(teacher, cfg.data, folder, on_chunk=progress.advance)
    for corpus in done:
        reporter(Message(f"distilled {corpus.key}: {corpus.lines:,} lines ({corpus.translated:,} translated "
                         f"by this run) in {corpus.source.src} and {corpus.source.tgt.name}"))

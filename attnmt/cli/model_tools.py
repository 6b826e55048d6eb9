"""Commands on trained models and configs: ``average``, ``export``, ``import``, ``info`` and ``shortlist``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError
from .app import command
from .contract import Output
from .options import ExportFormat, ModelArg, Quantization, SetOpt


@command(inputs=("checkpoints",), outputs={"out": Output()})
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Two or more checkpoint files "
                                                      "of one model config.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="The averaged checkpoint to write (atomically).",
                                      show_default=False)],
) -> None:
    """Average the parameters of several checkpoints into one that translate and eval accept."""
    from ..models.checkpoint import save_payload
    from ..training.averaging import average_checkpoints

    if len(checkpoints) < 2:
        raise ConfigError(f"average needs at least two checkpoints, got {len(checkpoints)}")
    resolved = [c.resolve() for c in checkpoints]
    if len(set(resolved)) < len(resolved):
        raise ConfigError("a checkpoint is given twice; each one counts once in the average")
    save_payload(average_checkpoints(checkpoints), out)
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {out}")


@command(inputs=("target",))
def info(
    target: Annotated[Path, typer.Argument(help="A config file, a checkpoint, or a run folder "
                                           "(its config.yaml and tokenizer).", show_default=False)],
    set_: SetOpt = None,
) -> None:
    """Print a model's architecture and parameter counts per part."""
    from rich.console import Console
    from rich.table import Table

    from ..models import build_model, parameter_counts
    from ..models.checkpoint import model_spec

    spec = model_spec(target, set_)
    try:
        model = build_model(spec.cfg.model, spec.src_vocab_size, spec.tgt_vocab_size, train=spec.cfg.train)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    console = Console()
    settings = ", ".join(f"{k}={v}" for k, v in spec.cfg.model.model_dump().items() if k != "arch")
    console.print(f"[bold]{spec.cfg.model.arch}[/bold] ({settings}); "
                  f"vocabulary {spec.src_vocab_size} / {spec.tgt_vocab_size} "
                  f"from {spec.origin}")
    table = Table("part", "parameters", "share")
    counts = {k: v for k, v in parameter_counts(model).items() if v}
    total = sum(counts.values())
    for part, n in counts.items():
        table.add_row(part, f"{n:,}", f"{n / total:.1%}")
    table.add_row("[bold]total[/bold]", f"[bold]{total:,}[/bold]", "100.0%")
    console.print(table)
    console.print(str(model), markup=False, highlight=False)


@command(inputs=("model",), outputs={"out": Output(folder=True, replaces=False)})
def export(
    model: ModelArg,
    out: Annotated[Path, typer.Argument(help="The folder to write (new, or empty).", show_default=False)],
    to: Annotated[ExportFormat, typer.Option("--to", help="The inference engine, or huggingface: a Marian "
                                             "folder that transformers loads (MarianMTModel).")] = (
        ExportFormat.ctranslate2),
    quantization: Annotated[Quantization, typer.Option(
        "--quantization", help="How the engine stores the weights (int8: 8-bit weights and int8 products, "
        "the fastest on CPU); ctranslate2 only.")] = Quantization.float32,
) -> None:
    """Export a Transformer checkpoint for CTranslate2, with its sentencepiece models: translate and eval
    then accept OUT in place of MODEL (needs the ct2 extra: pip install 'attnmt\\[ct2]'); or, with --to
    huggingface, as a Marian folder for transformers and the hub (post-norm Transformers that a Marian
    model represents: an imported OPUS-MT model, fine-tuned or not, or one trained with its options)."""
    if to is ExportFormat.huggingface:
        from ..models.marian_io import export_marian

        if quantization is not Quantization.float32:
            raise ConfigError(f"--quantization {quantization.value}: for --to ctranslate2 only")
        checkpoint, cfg = export_marian(model, out)
        typer.echo(f"exported {checkpoint} to {out} (huggingface: MarianMTModel, float32)")
        _say_aligner_left_out(cfg.train.alignment, "a Marian folder")
        return
    from ..config.schema import config_from_dict
    from ..decoding.ctranslate import export_ctranslate2

    manifest = export_ctranslate2(model, out, quantization.value)
    typer.echo(f"exported {manifest['checkpoint']} to {out} ({to.value}, {quantization.value})")
    _say_aligner_left_out(config_from_dict(manifest["config"]).train.alignment, "a CTranslate2 model")


def _say_aligner_left_out(guided, what: str) -> None:
    """An export leaves a model's alignment layer out (the engines have no place for it): said on stderr."""
    if guided is not None and guided.module == "layer":
        sys.stderr.write(f"note: the alignment layer is not exported ({what} has no place for it); align, "
                         "plot and translate --markup read it from the attnmt checkpoint\n")


@command(name="import", inputs=("folder",), outputs={"out": Output()})
def import_(
    folder: Annotated[Path, typer.Argument(help="A Hugging Face Marian folder (an OPUS-MT model: "
                                           "config.json, "
                                           "model.safetensors or pytorch_model.bin, source.spm, target.spm, "
                                           "vocab.json), downloaded beforehand.", show_default=False)],
    out: Annotated[Path, typer.Argument(help="The attnmt checkpoint to write (atomically).",
                                        show_default=False)],
) -> None:
    """Import an OPUS-MT (Marian) model as an attnmt checkpoint that every command accepts: translate, eval,
    the attention tools, serve, export, and train.init_from to fine-tune it. Reads the files only
    (safetensors, torch's weights-only loader, sentencepiece); downloads nothing."""
    from ..models.checkpoint import save_payload
    from ..models.marian_io import import_marian

    payload = import_marian(folder)
    save_payload(payload, out)
    m = payload["config"]["model"]
    sizes = payload["fingerprint"]["tokenizer"]
    langs = payload["config"]["data"].get("target_tokens")
    typer.echo(f"imported {folder} into {out}: Transformer {m['enc_layers']}+{m['dec_layers']} layers, "
               f"d_model "
               f"{m['d_model']}, vocabulary {sizes['src_vocab_size']} / {sizes['tgt_vocab_size']}"
               + (f"; target languages (--tgt-lang): {', '.join(langs)}" if langs else ""))


@command(inputs=("run_dir",), outputs={"out": Output()})
def shortlist(
    run_dir: Annotated[Path, typer.Argument(help="A prepared run folder: its encoded training pairs and "
                                            "tokenizer.", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where to write the table (default: "
                                             "RUN/shortlist.pt).", show_default=False)] = None,
    per_piece: Annotated[int, typer.Option("--per-piece", min=1, max=100_000, help="Target pieces listed "
                                           "per source piece (by Dice's coefficient).")] = 50,
    frequent: Annotated[int, typer.Option("--frequent", min=0, max=1_000_000, help="The most frequent "
                                          "target pieces, always listed.")] = 100,
) -> None:
    """Learn a lexical shortlist from a run's training pairs, for translate --shortlist: per batch, the
    output layer cut to the pieces its sources may translate to (off unless asked for)."""
    from ..data.batching import load_split
    from ..data.tokenizer import load_tokenizer
    from ..decoding.shortlist import build_shortlist, save_shortlist
    from ..errors import DataError
    from ..runfiles import RunDir

    run = RunDir(run_dir)
    split = load_split(run, "train") if run.tokenizer.exists() else None
    if split is None:
        raise DataError(f"{run_dir}: no prepared training data (attnmt prepare CONFIG --run-dir {run_dir})")
    tokenizer = load_tokenizer(run.tokenizer)
    table = build_shortlist(split.src_ids, split.tgt_ids, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size,
                            per_piece, frequent, tokenizer.fingerprint())
    path = out if out is not None else run.root / "shortlist.pt"
    save_shortlist(table, path, {"per_piece": per_piece, "frequent_pieces": frequent, "pairs": len(split)})
    typer.echo(f"wrote {path}: {per_piece} target pieces per source piece and the {len(table.frequent)} most "
               f"frequent, from {len(split):,} pairs")

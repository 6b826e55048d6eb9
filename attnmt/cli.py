"""The ``attnmt`` command line: the only module that prints, uses rich or chooses exit codes.

Every expected failure is an ``AttnmtError`` raised below; ``_guard`` turns it into one ``error:`` line on
stderr and the exit code of its class (``errors.py``). Anything else is a bug: one line, exit 1, and
``--debug`` shows the traceback. Heavy libraries are imported inside the commands so that
``attnmt --help`` stays fast and never touches the network.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from .errors import AttnmtError, ConfigError, DataError

app = typer.Typer(
    name="attnmt",
    help="Train, decode, score and look inside attention-based neural machine translation models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)

_state = {"debug": False}


def _print_version(value: bool) -> None:
    # Eager, so that it runs while parsing: `attnmt --version` has no command for the group callback to wait for.
    if value:
        from . import __version__

        typer.echo(f"attnmt {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show a full traceback on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    _state["debug"] = debug
    # The console shows warnings (everything with --debug); a run's own log file may record more.
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "attnmt_console", False)), None)
    if handler is None:
        handler = logging.StreamHandler()
        handler.attnmt_console = True
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    # This invocation's stderr: a program that runs app() more than once may swap it between calls (setStream
    # would flush the old stream, which may be closed by then).
    handler.stream = sys.stderr
    handler.setLevel(logging.DEBUG if debug else logging.WARNING)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


OOM_HINT = "reduce the batch: --max-tokens, decode.max_tokens or train.max_tokens"


def _out_of_memory(e: Exception) -> bool:
    """torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError; told apart by name and message so
    that this module need not import torch."""
    text = str(e)
    return type(e).__name__ == "OutOfMemoryError" or "DefaultCPUAllocator" in text or "can't allocate memory" in text


def _guard(body: Callable[[], None]) -> None:
    """Run a command body, mapping failures to the exit-code contract."""
    try:
        body()
    except AttnmtError as e:
        if _state["debug"]:
            raise
        _fail(str(e).replace("\n", " "), e.exit_code)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining at exit
        # when it flushes stdout. Caught here, before `Exception` would report it as an internal error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except MemoryError:
        _fail(f"out of memory ({OOM_HINT})", 5)
    except Exception as e:
        if _state["debug"]:
            raise
        if _out_of_memory(e):
            _fail(f"out of memory ({OOM_HINT})", 5)
        first = str(e).splitlines()[0] if str(e) else ""
        _fail(f"internal error: {type(e).__name__}: {first} (run with --debug for a traceback)", 1)


ConfigArg = Annotated[Path, typer.Argument(help="The YAML config file.", show_default=False)]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="The run folder (default: train.run_dir of the config).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config key, e.g. --set train.lr=3e-4 (repeatable).")]


def _load(config: Path, overrides: list[str] | None):
    from .config import load_config

    return load_config(config, overrides or [])


@app.command()
def prepare(config: ConfigArg, run_dir: RunDirOpt = None, set_: SetOpt = None) -> None:
    """Clean the data, train or load the tokenizer, encode the corpora and print corpus statistics."""

    def body() -> None:
        cfg = _load(config, set_)
        import datasets

        from .prepare import prepare as run_prepare
        from .runfiles import RunDir, RunLock

        datasets.disable_progress_bars()
        run = RunDir(Path(run_dir) if run_dir is not None else cfg.train.run_dir)
        if run_dir is not None:
            cfg.train.run_dir = run.root.resolve()
        with RunLock(run):
            report = run_prepare(cfg, run)
        _print_report(report)

    _guard(body)


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"corpus statistics ({report.run_dir})", title_justify="left")
    table.add_column("")
    for s in report.splits:
        table.add_column(s.name, justify="right")
    reasons = list(dict.fromkeys(why for s in report.splits for why in s.dropped))
    rows = [("pairs read", [f"{s.read:,}" for s in report.splits]), ("pairs kept", [f"{s.kept:,}" for s in report.splits])]
    rows += [(f"dropped: {why}", [f"{s.dropped.get(why, 0):,}" for s in report.splits]) for why in reasons]
    for side in ("src", "tgt"):
        rows.append((f"{side} pieces", [f"{getattr(s, side + '_tokens'):,}" for s in report.splits]))
        rows.append((f"{side} length p50/p90/p99/max", ["/".join(map(str, getattr(s, side + "_percentiles").values())) for s in report.splits]))
        rows.append((f"{side} unknown-piece rate", [f"{getattr(s, side + '_unk_rate'):.3%}" for s in report.splits]))
    for label, values in rows:
        table.add_row(label, *values)
    console = Console()
    console.print(table)
    kind = "joint" if report.joint else "separate"
    sizes = f"{report.src_vocab_size}" if report.joint else f"{report.src_vocab_size} / {report.tgt_vocab_size}"
    console.print(f"tokenizer: {kind}, {sizes} pieces ({'trained' if report.tokenizer_trained else 'loaded'})")


@app.command("toy-data")
def toy_data(
    out_dir: Annotated[Path, typer.Argument(help="Folder to write train/dev/test .en, .de and .align files into.")],
    train_size: Annotated[int, typer.Option(min=1)] = 10000,
    dev_size: Annotated[int, typer.Option(min=1)] = 500,
    test_size: Annotated[int, typer.Option(min=1)] = 500,
    seed: int = 1,
) -> None:
    """Write the embedded toy task (English -> German dates) with its gold word alignments."""

    def body() -> None:
        from .data import write_toy

        files = write_toy(out_dir, {"train": train_size, "dev": dev_size, "test": test_size}, seed)
        typer.echo(f"wrote {len(files)} files to {out_dir}")

    _guard(body)


@app.command()
def train(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Require a checkpoint to resume from (a run folder with one resumes anyway).")] = False,
) -> None:
    """Train a model from a config; a run folder that has a checkpoint resumes where it stopped."""

    def body() -> None:
        cfg = _load(config, set_)
        import datasets

        from .runfiles import RunDir, RunLock
        from .train import Interrupted, fit

        datasets.disable_progress_bars()
        run = RunDir(Path(run_dir) if run_dir is not None else cfg.train.run_dir)
        cfg.train.run_dir = run.root.resolve()
        rank = int(os.environ.get("RANK", "0"))
        reporter = _TrainReporter(enabled=rank == 0)
        lock = RunLock(run) if rank == 0 else contextlib.nullcontext()
        try:
            with lock, reporter:
                fit(cfg, run, reporter, resume=resume)
        except Interrupted as e:
            sys.stderr.write(f"attnmt: {e}\n")
            raise typer.Exit(e.exit_code) from None

    _guard(body)


class _TrainReporter:
    """Shows training events: a rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = Console(stderr=False)
        self.live = enabled and self.console.is_terminal
        self.progress = None
        self.task = None

    def __enter__(self) -> _TrainReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, kind: str, record: dict) -> None:
        if not self.enabled:
            return
        if kind == "start":
            self.console.print(
                f"training on {record['device']} x {record['world_size']}: {record['parameters']:,} parameters, "
                f"{record['steps_per_epoch']:,} steps per epoch, {record['total']:,} steps planned"
            )
            if self.live:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )

                self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                         TextColumn("{task.fields[status]}"), console=self.console)
                self.task = self.progress.add_task("train", total=record["total"], completed=record["step"], status="")
                self.progress.start()
        elif kind == "train":
            status = (f"epoch {record['epoch']:.2f}  loss {record['loss']:.3f}  lr {record['lr']:.2e}  "
                      f"{record['tokens_per_s']:,.0f} tok/s")
            if self.progress is not None:
                self.progress.update(self.task, completed=record["step"], status=status)
            else:
                self.console.print(f"step {record['step']}  {status}", highlight=False)
        elif kind == "valid":
            from rich.table import Table

            table = Table(title=f"validation at step {record['step']}", title_justify="left")
            for column in ("loss", "ppl", "BLEU", "chrF"):
                table.add_column(column, justify="right")
            table.add_row(f"{record['loss']:.3f}", f"{record['ppl']:.2f}", f"{record['bleu']:.2f}", f"{record['chrf']:.2f}")
            self.console.print(table)
            self.console.print(f"  {record['bleu_signature']}", highlight=False, markup=False)
            self.console.print(f"  e.g. {record['example']}", highlight=False, markup=False)
        elif kind == "nonfinite":
            self.console.print(f"[yellow]step {record['step']}: non-finite loss or gradient, step skipped ({record['skips']} so far)[/yellow]")
        elif kind == "message":
            self.console.print(record["text"], highlight=False, markup=False)
        elif kind == "end":
            if self.progress is not None:
                self.progress.update(self.task, completed=record["step"])
            best = f"; best {record['best_score']:.2f} at step {record['best_step']}" if record.get("best_score") is not None else ""
            self.console.print(f"finished at step {record['step']} ({record['reason']}){best}")


ModelArg = Annotated[Path, typer.Argument(help="A checkpoint file, or a run folder (its best checkpoint, else its latest).", show_default=False)]
BeamOpt = Annotated[int | None, typer.Option("--beam-size", min=1, help="Beam size; 1 = greedy (default: the model's decode.beam_size).")]
NbestOpt = Annotated[int, typer.Option("--nbest", min=1, help="Write this many hypotheses per line (TSV: index, score, text).")]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", min=1, help="Batch budget: padded source pieces x beam.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
LengthPenaltyOpt = Annotated[float | None, typer.Option("--length-penalty", min=0.0, help="GNMT alpha (default: decode.length_penalty).")]
CHUNK_LINES = 1000


def _translator(model_path: Path, beam_size, nbest, max_tokens, device, length_penalty):
    """Load MODEL and build a Translator; decode settings default to the model's ``decode`` section."""
    import torch

    from .checkpoint import load_model
    from .decode import Translator
    from .runtime import keep_freed_memory

    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device: {device!r} is not one of auto, cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: CUDA is not available on this machine; use --device cpu")
    dev = torch.device("cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    keep_freed_memory()  # decoding reuses the same large blocks every step; see runtime.py
    model, tokenizer, cfg, path = load_model(model_path, dev)
    d = cfg.decode
    beam = beam_size if beam_size is not None else max(d.beam_size, nbest)
    if nbest > beam:
        raise ConfigError(f"--nbest {nbest} must not exceed the beam size {beam}")
    if beam > tokenizer.tgt_vocab_size:
        raise ConfigError(f"--beam-size {beam} exceeds the target vocabulary ({tokenizer.tgt_vocab_size} pieces)")
    translator = Translator(model, tokenizer, beam, nbest, d.length_penalty if length_penalty is None else length_penalty,
                            d.max_len_a, d.max_len_b, d.min_len, d.max_src_len, max_tokens or d.max_tokens, dev)
    return translator, cfg, path


def _input_lines(path: Path | None) -> Iterator[str]:
    """Lines of a file (plain or gzipped) or of stdin (``-``), read lazily, split on \\n only."""
    from .data import read_lines
    from .errors import DataError

    if path is not None and str(path) != "-":
        yield from read_lines(path)
        return
    if sys.stdin.isatty():
        sys.stderr.write("attnmt: reading sentences from the terminal, one per line; Ctrl-D to end\n")
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            yield raw.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as e:
            raise DataError(f"<stdin>:{number}: invalid UTF-8 at byte offset {e.start}") from None


def _refuse_overwrite(flag: str, output: Path | None, inputs: list[Path | None]) -> None:
    """Writing to an input would truncate it before it is read (and lose it): refuse, before any work; a
    folder in place of the output file is refused as early."""
    if output is not None and output.is_dir():
        raise ConfigError(f"{flag} {output} is a folder; give a file name")
    if output is not None and any(p is not None and output.resolve() == Path(p).resolve() for p in inputs):
        raise ConfigError(f"{flag} {output} is an input file; refusing to overwrite the input")


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@app.command()
def translate(
    model: ModelArg,
    sentences: Annotated[list[str] | None, typer.Argument(help="Sentences to translate (else --input).", show_default=False)] = None,
    input_: Annotated[Path | None, typer.Option("--input", "-i", help="A file to translate, or - for stdin (read lazily).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")] = None,
    beam_size: BeamOpt = None,
    nbest: NbestOpt = 1,
    max_tokens: MaxTokensOpt = None,
    length_penalty: LengthPenaltyOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Translate sentences, a file or stdin; one output line per input line, in input order."""

    def body() -> None:
        from .runfiles import atomic_write_text

        if sentences and input_ is not None:
            raise ConfigError("give sentences as arguments or --input, not both")
        inputs = [input_] if input_ is not None and str(input_) != "-" else []
        _refuse_overwrite("--output", output, inputs + [model])
        translator, _, checkpoint = _translator(model, beam_size, nbest, max_tokens, device, length_penalty)
        _refuse_overwrite("--output", output, [checkpoint])
        lines = iter(sentences) if sentences else _input_lines(input_)
        written: list[str] = []
        truncated = 0
        index = 0
        for chunk in _chunks(lines, CHUNK_LINES):
            results = translator.translate(chunk)
            text = []
            for result in results:
                truncated += result.truncated
                if nbest == 1:
                    text.append(result.outputs[0][0] + "\n")
                else:
                    text.extend(f"{index}\t{score:.4f}\t{out}\n" for out, score in result.outputs)
                index += 1
            if output is None:
                sys.stdout.write("".join(text))
                sys.stdout.flush()  # per chunk, so that a pipe sees results as they come
            else:
                written.extend(text)
        if output is not None:
            atomic_write_text(output, "".join(written))
        if truncated:
            sys.stderr.write(f"warning: {truncated} line(s) longer than decode.max_src_len pieces were truncated\n")

    _guard(body)


@app.command("eval")
def eval_(
    model: Annotated[Path | None, typer.Argument(help="A checkpoint or run folder; omit with --hyp.", show_default=False)] = None,
    src: Annotated[Path | None, typer.Option("--src", help="Source file to translate and score.")] = None,
    hyp: Annotated[Path | None, typer.Option("--hyp", help="Existing translations to score (instead of MODEL --src).")] = None,
    ref: Annotated[list[Path] | None, typer.Option("--ref", help="Reference file (repeat for several references).")] = None,
    metrics: Annotated[str, typer.Option("--metrics", help="Comma-separated: bleu, chrf, ter.")] = "bleu,chrf,ter",
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Case-insensitive scores.")] = False,
    tokenize: Annotated[str | None, typer.Option("--tokenize", help="BLEU tokenizer (13a, zh, intl, char, none, ...); default from the target language.")] = None,
    tgt_lang: Annotated[str | None, typer.Option("--tgt-lang", help="Target language code (picks BLEU's tokenizer, e.g. zh).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    hyp_out: Annotated[Path | None, typer.Option("--hyp-out", help="Also write the translations here.")] = None,
    beam_size: BeamOpt = None,
    max_tokens: MaxTokensOpt = None,
    length_penalty: LengthPenaltyOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Score translations with sacrebleu: translate --src with MODEL, or score --hyp; against --ref."""

    def body() -> None:
        import json

        from .data import read_lines
        from .errors import DataError
        from .metrics import METRICS, corpus_scores
        from .runfiles import atomic_write_text

        names = [m.strip().lower() for m in metrics.split(",") if m.strip()]
        unknown = [m for m in names if m not in METRICS]
        if unknown or not names:
            raise ConfigError(f"--metrics: {', '.join(unknown) or '(none)'} not among {', '.join(METRICS)}")
        if not ref:
            raise ConfigError("--ref is required")
        if (hyp is None) == (model is None or src is None):
            raise ConfigError("give either MODEL --src FILE, or --hyp FILE")
        _refuse_overwrite("--hyp-out", hyp_out, [src, hyp, model, *ref])
        references = [list(read_lines(r)) for r in ref]
        lang = tgt_lang
        if hyp is not None:
            hypotheses = list(read_lines(hyp))
            hyp_name = str(hyp)
        else:
            translator, cfg, _ = _translator(model, beam_size, 1, max_tokens, device, length_penalty)
            sources = list(read_lines(src))
            hypotheses = [t.outputs[0][0] for t in translator.translate(sources)]
            hyp_name, lang = f"translations of {src}", lang or cfg.data.tgt_lang
            if hyp_out is not None:
                atomic_write_text(hyp_out, "".join(h + "\n" for h in hypotheses))
        for r, lines in zip(ref, references):
            if not lines:
                raise DataError(f"{r}: the reference file is empty")
            if len(lines) != len(hypotheses):
                raise DataError(f"{hyp_name} has {len(hypotheses)} lines, {r} has {len(lines)}")
        if not hypotheses:
            raise DataError(f"{hyp_name}: no lines to score")
        scores = corpus_scores(hypotheses, references, names, tgt_lang=lang, tokenize=tokenize, lowercase=lowercase)
        if json_:
            typer.echo(json.dumps([{"metric": s.name, "score": round(s.score, 4), "signature": s.signature, "text": s.text}
                                   for s in scores.values()], ensure_ascii=False))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table("metric", "score", "signature")
        for s in scores.values():
            table.add_row(s.name.upper() if s.name != "chrf" else "chrF", f"{s.score:.2f}", s.signature)
        Console().print(table)

    _guard(body)


FormatOpt = Annotated[str, typer.Option("--format", help="Figure format: png, svg or pdf.")]
DpiOpt = Annotated[int, typer.Option("--dpi", min=10, max=1200, help="Resolution of png figures (dots per inch).")]


def _layer_choice(option: str, value: int | None, n_layers: int, what: str) -> int | None:
    """A 1-based --layer/--head value checked against the model; returned 0-based."""
    if value is None:
        return None
    if not 1 <= value <= n_layers:
        raise ConfigError(f"{option} {value}: the model has {n_layers} {what} (1..{n_layers})")
    return value - 1


@app.command()
def plot(
    model: ModelArg,
    sentences: Annotated[list[str] | None, typer.Argument(help="Sentences to translate and draw (else --input).", show_default=False)] = None,
    input_: Annotated[Path | None, typer.Option("--input", "-i", help="A file of sentences, or - for stdin.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Draw only the first N sentences.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the figures into.", show_default=False)] = ...,
    layer: Annotated[int | None, typer.Option("--layer", min=1, help="Only this layer (1-based; default: every layer).")] = None,
    head: Annotated[int | None, typer.Option("--head", min=1, help="Only this head (1-based; default: every head and their average).")] = None,
    self_: Annotated[bool, typer.Option("--self", help="Also draw encoder and decoder self-attention (Transformer).")] = False,
    words: Annotated[bool, typer.Option("--words", help="Label words instead of pieces (source pieces summed, target pieces averaged).")] = False,
    fmt: FormatOpt = "png",
    dpi: DpiOpt = 100,
    beam_size: BeamOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Translate sentences, then draw the model's attention on each sentence and its translation.

    The translation is read back under teacher forcing, so every layer and head is there: an LSTM's one
    attention map; a Transformer's cross-attention per layer as a grid of heads and their average (and with
    --self its encoder and decoder self-attention). Files: NNNN_cross_layerL.png, NNNN_enc_self_layerL.png, ...
    """

    def body() -> None:
        import time

        from .attention_maps import teacher_forced_attention
        from .data import clean
        from .plot import FORMATS, KIND_TITLES, HeatmapFigure, sentence_maps

        if fmt not in FORMATS:
            raise ConfigError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
        if sentences and input_ is not None:
            raise ConfigError("give sentences as arguments or --input, not both")
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file; give a folder")
        translator, cfg, _ = _translator(model, beam_size, 1, None, device, None)
        n_layers, n_heads = _attention_shape(cfg.model)
        if self_ and cfg.model.arch != "transformer":
            raise ConfigError(f"--self: a {cfg.model.arch} model has no self-attention to draw")
        kinds = ["cross", "enc_self", "dec_self"] if self_ else ["cross"]
        layers = {kind: _layer_choice("--layer", layer, n_layers[kind], f"{KIND_TITLES[kind]} layers") for kind in kinds}
        head_index = _layer_choice("--head", head, n_heads, "attention heads")
        lines = iter(sentences) if sentences else _input_lines(input_)
        started = time.perf_counter()
        tokenizer, painter = translator.tokenizer, HeatmapFigure()
        written, number, truncated = 0, 0, 0
        for chunk in _chunks(itertools.islice(lines, limit), CHUNK_LINES):
            texts = [clean(line) for line in chunk]
            todo = [i for i, text in enumerate(texts) if text]
            encoded = tokenizer.encode_src([texts[i] for i in todo])
            truncated += sum(len(ids) > translator.max_src_len for ids in encoded)
            encoded = [ids[: translator.max_src_len] for ids in encoded]
            hyps = [found[0].tokens for found in translator.search(encoded)]
            maps = teacher_forced_attention(translator.model, encoded, hyps, translator.device, translator.max_tokens, kinds)
            for k, i in enumerate(todo):
                src_pieces = tokenizer.src_pieces(encoded[k]) + ["</s>"]
                tgt_pieces = tokenizer.tgt_pieces(hyps[k])
                labels = {"cross": (src_pieces, tgt_pieces + ["</s>"]), "enc_self": (src_pieces, src_pieces),
                          "dec_self": (["<s>"] + tgt_pieces, ["<s>"] + tgt_pieces)}
                for kind in kinds:
                    chosen = [layers[kind]] if layers[kind] is not None else None
                    written += len(sentence_maps(out, number + i + 1, {kind: maps[k][kind]}, labels, chosen, head_index, words,
                                                 fmt, dpi, painter=painter))
            number += len(chunk)
        if number == 0:
            raise DataError("no sentences to draw")
        seconds = time.perf_counter() - started
        typer.echo(f"wrote {written} figures of {number} sentence(s) to {out} in {seconds:.1f} s")
        if truncated:
            sys.stderr.write(f"warning: {truncated} line(s) longer than decode.max_src_len pieces were truncated\n")

    _guard(body)


def _attention_shape(model_cfg) -> tuple[dict[str, int], int]:
    """({kind: layers}, heads) of a model config: an LSTM has one single-head cross-attention."""
    if model_cfg.arch == "transformer":
        layers = {"cross": model_cfg.dec_layers, "enc_self": model_cfg.enc_layers, "dec_self": model_cfg.dec_layers}
        return layers, model_cfg.n_heads
    return {"cross": 1}, 1


def _words_to_pieces(encode, lines: list[str]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Pre-tokenised lines (words split on spaces) -> (piece ids of each line, the piece positions of each
    word). Words are encoded one by one, so a word's pieces are exactly its own; a word that encodes to
    nothing (say, a lone zero-width space) gets the unknown piece, so every word keeps its index."""
    from .data import clean
    from .tokenizer import UNK_ID

    words = [clean(line).split() for line in lines]
    flat = [w for line_words in words for w in line_words]
    encoded = iter(encode(flat) if flat else [])
    ids: list[list[int]] = []
    groups: list[list[list[int]]] = []
    for line_words in words:
        line_ids: list[int] = []
        line_groups: list[list[int]] = []
        for _ in line_words:
            pieces = next(encoded) or [UNK_ID]
            line_groups.append(list(range(len(line_ids), len(line_ids) + len(pieces))))
            line_ids.extend(pieces)
        ids.append(line_ids)
        groups.append(line_groups)
    return ids, groups


def _layer_or_avg(value: str) -> int | None:
    """--layer: a 1-based layer number, last, or avg (every layer and head averaged); returned as a
    0-based index (-1 for last) or None for avg."""
    choice = value.strip().lower()
    if choice in ("avg", "average", "mean"):
        return None
    if choice == "last":
        return -1
    try:
        number = int(choice)
    except ValueError:
        raise ConfigError(f"--layer {value!r}: expected a layer number (1, 2, ...), last or avg") from None
    if number < 1:
        raise ConfigError(f"--layer {value}: layers count from 1")
    return number - 1


@app.command()
def align(
    model: ModelArg,
    src: Annotated[Path, typer.Option("--src", help="Source sentences, one per line (words split on spaces).", show_default=False)],
    tgt: Annotated[Path | None, typer.Option("--tgt", help="Target sentences to align with (default: the model's own translations).")] = None,
    gold: Annotated[Path | None, typer.Option("--gold", help="Gold alignments (Pharaoh: i-j sure, i?j or ipj possible) to score against.")] = None,
    layer: Annotated[str, typer.Option("--layer", help="Cross-attention layer to align with: 1, 2, ..., last, or avg (over layers and heads).")] = "last",
    method: Annotated[str, typer.Option("--method", help="argmax: each target word's most attended source word; threshold: every weight >= --threshold.")] = "argmax",
    threshold: Annotated[float, typer.Option("--threshold", help="Weight a link needs with --method threshold (0 < X <= 1).")] = 0.3,
    one_based: Annotated[bool, typer.Option("--one-based", help="Word indices in --gold and in the output count from 1.")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the alignments here (atomically).")] = None,
    hyp_out: Annotated[Path | None, typer.Option("--hyp-out", help="Without --tgt: also write the translations that were aligned.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="With --gold: print the scores as JSON.")] = False,
    beam_size: BeamOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Word alignments from cross-attention under teacher forcing, in Pharaoh format (one line per pair).

    Words are the space-separated tokens of each line; the attention over a word's pieces is merged
    (source pieces summed, target pieces averaged). With --gold, print AER, precision and recall
    (Och & Ney 2003); the alignments are then written only with --output.
    """

    def body() -> None:
        import json

        from .attention_maps import alignment_matrix, teacher_forced_attention
        from .data import read_lines
        from .plot import alignment_scores, extract_alignment, format_pharaoh, merge_groups, parse_pharaoh
        from .runfiles import atomic_write_text

        if method not in ("argmax", "threshold"):
            raise ConfigError(f"--method {method!r}: expected argmax or threshold")
        if not 0 < threshold <= 1:
            raise ConfigError(f"--threshold {threshold}: expected a weight in (0, 1]")
        if gold is not None and tgt is None:
            raise ConfigError("--gold needs --tgt: gold links refer to the target sentences they were made for")
        if hyp_out is not None and tgt is not None:
            raise ConfigError("--hyp-out writes the model's own translations; it cannot be used with --tgt")
        layer_index = _layer_or_avg(layer)
        for flag, path in (("--output", output), ("--hyp-out", hyp_out)):
            _refuse_overwrite(flag, path, [src, tgt, gold, model])
        sources = list(read_lines(src))
        targets = list(read_lines(tgt)) if tgt is not None else None
        if targets is not None and len(targets) != len(sources):
            raise DataError(f"{src} has {len(sources)} lines, {tgt} has {len(targets)}")
        gold_links = []
        if gold is not None:
            gold_lines = list(read_lines(gold))
            if len(gold_lines) != len(sources):
                raise DataError(f"{src} has {len(sources)} lines, {gold} has {len(gold_lines)}")
            for number, line in enumerate(gold_lines, start=1):
                try:
                    gold_links.append(parse_pharaoh(line, one_based))
                except ValueError as e:
                    raise DataError(f"{gold}:{number}: {e}") from None
        translator, cfg, _ = _translator(model, beam_size, 1, None, device, None)
        n_layers = _attention_shape(cfg.model)[0]["cross"]
        if layer_index is not None and layer_index >= n_layers:
            raise ConfigError(f"--layer {layer}: the model has {n_layers} cross-attention layer(s) (1..{n_layers}, or avg)")
        if targets is None:
            targets = [t.outputs[0][0] for t in translator.translate(sources)]
            if hyp_out is not None:
                atomic_write_text(hyp_out, "".join(t + "\n" for t in targets))
        tokenizer = translator.tokenizer
        src_ids, src_groups = _words_to_pieces(tokenizer.encode_src, sources)
        tgt_ids, tgt_groups = _words_to_pieces(tokenizer.encode_tgt, targets)
        for i, (_, possible) in enumerate(gold_links):
            n_src, n_tgt = len(src_groups[i]), len(tgt_groups[i])
            outside = sorted(link for link in possible if link[0] >= n_src or link[1] >= n_tgt)
            if outside:
                shown = format_pharaoh(outside[:1], one_based)
                raise DataError(f"{gold}:{i + 1}: link {shown} is outside the pair ({n_src} source words, {n_tgt} target words)")
        pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
        maps = teacher_forced_attention(translator.model, [src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs],
                                        translator.device, translator.max_tokens, ["cross"])
        alignments: list[list[tuple[int, int]]] = [[] for _ in sources]
        for i, pair_maps in zip(pairs, maps):
            matrix = alignment_matrix(pair_maps, layer_index)[:-1, :-1]  # (T, S) without the EOS row and column
            words = merge_groups(matrix, tgt_groups[i], src_groups[i])  # (target words, source words)
            alignments[i] = extract_alignment(words, method, threshold)
        text = "".join(format_pharaoh(links, one_based) + "\n" for links in alignments)
        if output is not None:
            atomic_write_text(output, text)
        elif gold is None:
            sys.stdout.write(text)
        if gold is None:
            return
        score = alignment_scores(alignments, [s for s, _ in gold_links], [p for _, p in gold_links])
        if json_:
            typer.echo(json.dumps({"aer": round(score.aer, 6), "precision": round(score.precision, 6), "recall": round(score.recall, 6),
                                   "predicted": score.predicted, "sure": score.sure, "possible": score.possible,
                                   "sentences": score.sentences, "layer": layer, "method": method}))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table("AER", "precision", "recall", "links", "sure", "possible", "sentences",
                      title=f"alignment of {src} with layer {layer}, {method}", title_justify="left")
        table.add_row(f"{score.aer:.2%}", f"{score.precision:.2%}", f"{score.recall:.2%}", str(score.predicted), str(score.sure),
                      str(score.possible), str(score.sentences))
        Console().print(table)

    _guard(body)


@app.command("plot-curves")
def plot_curves(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (its metrics.jsonl, and plots/ for --gif).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The PNG to write (default: RUN_DIR/curves.png).")] = None,
    gif: Annotated[bool, typer.Option("--gif", help="Also animate the heatmaps written during training (train.plot_every) as GIFs.")] = False,
) -> None:
    """Training curves (train loss, dev loss, dev BLEU and chrF against the step) as one PNG."""

    def body() -> None:
        from .plot import assemble, curves_figure, read_metrics, save_figure
        from .runfiles import RunDir

        run = RunDir(run_dir)
        if not run.root.is_dir():
            raise DataError(f"{run_dir}: no such run folder")
        if not run.metrics.is_file():
            raise DataError(f"{run.metrics}: not found (has this run trained yet?)")
        try:
            fig = curves_figure(read_metrics(run.metrics), title=str(run.root.name))
        except ValueError as e:
            raise DataError(f"{run.metrics}: {e}") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{run.metrics}: invalid UTF-8 at byte offset {e.start}") from None
        target = out if out is not None else run.root / "curves.png"
        if target.is_dir():
            raise ConfigError(f"--out {target} is a folder; give a file name")
        save_figure(fig, target, "png")
        typer.echo(f"wrote {target}")
        if not gif:
            return
        frames: dict[str, list[Path]] = {}
        for step_dir in sorted((run.root / "plots").glob("step_*")):
            for png in sorted(step_dir.glob("*.png")):
                frames.setdefault(png.name, []).append(png)
        if not frames:
            raise DataError(f"{run.root / 'plots'}: no heatmaps from training (train them with --set train.plot_every=1)")
        for name, paths in frames.items():
            animation = assemble(paths, run.root / "plots" / (Path(name).stem + ".gif"))
            typer.echo(f"wrote {animation} ({len(paths)} frames)")

    _guard(body)


@app.command()
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Two or more checkpoint files of one model config.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="The averaged checkpoint to write (atomically).", show_default=False)],
) -> None:
    """Average the parameters of several checkpoints into one that translate and eval accept."""

    def body() -> None:
        from .checkpoint import average_checkpoints, save_payload

        if len(checkpoints) < 2:
            raise ConfigError(f"average needs at least two checkpoints, got {len(checkpoints)}")
        resolved = [c.resolve() for c in checkpoints]
        if len(set(resolved)) < len(resolved):
            raise ConfigError("a checkpoint is given twice; each one counts once in the average")
        if out.resolve() in resolved:
            raise ConfigError(f"--out {out} is one of the checkpoints; refusing to overwrite an input")
        if out.is_dir():
            raise ConfigError(f"--out {out} is a folder; give a file name")
        save_payload(average_checkpoints(checkpoints), out)
        typer.echo(f"averaged {len(checkpoints)} checkpoints into {out}")

    _guard(body)


def _model_spec(target: Path, overrides: list[str] | None):
    """(config, source vocabulary size, target vocabulary size, where the sizes come from) of a config
    file, a checkpoint or a run folder."""
    from .runfiles import RunDir
    from .tokenizer import load_tokenizer

    if target.is_file() and target.suffix not in (".yaml", ".yml"):
        from .checkpoint import load_checkpoint
        from .config import config_from_dict

        payload = load_checkpoint(target)
        cfg = config_from_dict(payload["config"], source=f"{target} (its config)", overrides=overrides or [])
        sizes = payload["fingerprint"]["tokenizer"]
        return cfg, sizes["src_vocab_size"], sizes["tgt_vocab_size"], "the checkpoint's tokenizer"
    if target.is_dir():
        run = RunDir(target)
        cfg = _load(run.config, overrides)
        if run.tokenizer.exists():
            tokenizer = load_tokenizer(run.tokenizer)
            return cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, "the run's tokenizer"
        return cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size, "tokenizer.vocab_size"
    cfg = _load(target, overrides)
    return cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size, "tokenizer.vocab_size"


@app.command()
def info(
    target: Annotated[Path, typer.Argument(help="A config file, a checkpoint, or a run folder (its config.yaml and tokenizer).", show_default=False)],
    set_: SetOpt = None,
) -> None:
    """Print a model's architecture and parameter counts per part."""

    def body() -> None:
        from rich.console import Console
        from rich.table import Table

        from .models import build_model, parameter_counts

        cfg, src_vocab, tgt_vocab, origin = _model_spec(target, set_)
        try:
            model = build_model(cfg.model, src_vocab, tgt_vocab)
        except ValueError as e:
            raise ConfigError(f"model: {e}") from None
        console = Console()
        settings = ", ".join(f"{k}={v}" for k, v in cfg.model.model_dump().items() if k != "arch")
        console.print(f"[bold]{cfg.model.arch}[/bold] ({settings}); vocabulary {src_vocab} / {tgt_vocab} from {origin}")
        table = Table("part", "parameters", "share")
        counts = {k: v for k, v in parameter_counts(model).items() if v}
        total = sum(counts.values())
        for part, n in counts.items():
            table.add_row(part, f"{n:,}", f"{n / total:.1%}")
        table.add_row("[bold]total[/bold]", f"[bold]{total:,}[/bold]", "100.0%")
        console.print(table)
        console.print(str(model), markup=False, highlight=False)

    _guard(body)

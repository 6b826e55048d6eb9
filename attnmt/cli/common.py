"""What the commands share: input lines from a file, a pipe or stdin, outputs written atomically, and a
trained model opened for decoding (the checks on inputs and outputs are ``contract.py``'s)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.choices import Device
from ..errors import ConfigError, DataError

if TYPE_CHECKING:
    from ..decoding.translator import DecodeOverrides


def input_lines(path: Path | None) -> Iterator[str]:
    """Lines of a file (plain or gzipped), a pipe, or stdin (``-`` or None), read lazily as they arrive,
    split on \\n only."""
    from ..data.readers import read_lines

    stdin = path is None or str(path) == "-"
    if stdin and sys.stdin.isatty():
        sys.stderr.write("attnmt: reading sentences from the terminal, one per line; Ctrl-D to end\n")
    yield from read_lines("-" if stdin else path)


def sentences_or_input(sentences: list[str] | None, input_: Path | None) -> Iterable[str]:
    """The sentences given as arguments, else the lines of ``--input`` (a file, or stdin)."""
    if sentences and input_ is not None:
        raise ConfigError("give sentences as arguments or --input, not both")
    return iter(sentences) if sentences else input_lines(input_)


def read_pairs(src: Path, tgt: Path | None) -> tuple[list[str], list[str] | None]:
    """The lines of ``src`` and, when given, of ``tgt``, which must have as many (else a DataError)."""
    from ..data.readers import read_lines

    sources = list(read_lines(src))
    targets = list(read_lines(tgt)) if tgt is not None else None
    if targets is not None and len(targets) != len(sources):
        raise DataError(f"{src} has {len(sources)} lines, {tgt} has {len(targets)}")
    return sources, targets


def write_output(output: Path | None, text: str) -> None:
    """``text`` into ``output`` atomically, or onto stdout without one."""
    from ..runfiles import atomic_write_text

    if output is not None:
        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


def _preparer(int8: bool | None, cfg, device, path: Path):
    """How a loaded model is made ready to decode: int8 linear layers (``int8``, or None and the model's
    ``decode.quantize: int8``), or the CPU fast path."""
    from ..decoding import fastpath, quantize

    if not (int8 if int8 is not None else cfg.decode.quantize == "int8"):
        return fastpath.apply
    if device.type != "cpu":
        raise ConfigError(f"--int8 (or {path}'s decode.quantize: int8) runs on the CPU; this command would "
                          f"decode on {device.type} (--device cpu)")
    return quantize.quantize_int8


def open_translator(model_path: Path, device: Device = Device.auto, overrides: DecodeOverrides | None = None,
                    *, ensemble: list[Path] | None = None, exports: bool = True,
                    shortlist: Path | None = None):
    """Load MODEL for decoding: (Translator, config, checkpoint path). Decode settings are the model's
    ``decode`` section with the command line's ``overrides`` (``translator.DecodeOverrides``: beam, n-best,
    length penalty, token budget, sampling, a multilingual model's target language: ``source_prefix``); the
    model gets the CPU fast path (``fastpath.py``) and the process keeps freed memory for reuse
    (``runtime.py``), as every decoding command does. ``ensemble``: more models, with the same tokenizer
    (else a CheckpointError), averaged step by step with MODEL (``models.Ensemble``); MODEL's decode
    settings apply. A folder ``attnmt export`` wrote decodes through CTranslate2 (``open_export``) unless
    ``exports`` is False (commands that read the attention: a CheckpointError then). ``shortlist``: the
    table ``attnmt shortlist`` wrote, which cuts the output layer per batch (``decoding/shortlist.py``)."""
    from ..decoding.translator import DecodeOverrides, Translator
    from ..models import checkpoint
    from ..training.distributed import choose_device
    from .runtime import keep_freed_memory

    overrides = overrides if overrides is not None else DecodeOverrides()
    dev = choose_device(device, "--device")
    keep_freed_memory()  # decoding reuses the same large blocks every step
    from ..decoding.ctranslate import is_export

    if is_export(model_path) and exports:
        if overrides.int8:
            raise ConfigError(f"--int8: {model_path} is a CTranslate2 export, which decodes at the precision "
                              "it was exported with (attnmt export --quantization int8)")
        if shortlist is not None:
            raise ConfigError(f"--shortlist: {model_path} is a CTranslate2 export, which decodes with its "
                              "own search; use the checkpoint")
        return open_export(model_path, dev, overrides, ensemble)
    model, tokenizer, cfg, path = checkpoint.load_model(model_path, dev)
    prepare = _preparer(overrides.int8, cfg, dev, path)
    prepare(model)
    if ensemble:
        from ..errors import CheckpointError
        from ..models import Ensemble

        members = [model]
        for other in ensemble:
            member, member_tokenizer, _, member_path = checkpoint.load_model(other, dev)
            if member_tokenizer.fingerprint() != tokenizer.fingerprint():
                raise CheckpointError(f"--ensemble {member_path}: its tokenizer is not {path}'s; an ensemble "
                                      "averages the same pieces, so its models must share one tokenizer")
            prepare(member)
            members.append(member)
        model = Ensemble(members).eval()
    decode = overrides.apply(cfg.decode, tokenizer.tgt_vocab_size)
    translator = Translator(model, tokenizer, decode, dev, overrides.sampling)
    translator.source_prefix = cfg.data.prefix_for(overrides.tgt_lang, overrides.named("tgt_lang"))
    if shortlist is not None:
        from ..decoding.shortlist import load_shortlist

        translator.shortlist = load_shortlist(shortlist, tokenizer.fingerprint(), path)
    return translator, cfg, path


def open_for_attention(model_path: Path, device: Device, beam_size: int | None, int8: bool | None = None):
    """``open_translator`` for the commands that read the attention (plot, align, attribute, heads): the
    model's decode settings but the beam, and a CTranslate2 export refused (it has no attention to read).
    ``int8`` as ``DecodeOverrides.int8`` (False: the float model whatever the config says, for the commands
    that take gradients or compare against the float model)."""
    from ..decoding.translator import DecodeOverrides

    return open_translator(model_path, device, DecodeOverrides(beam_size, int8=int8), exports=False)


def open_export(folder: Path, dev, overrides: DecodeOverrides, ensemble: list[Path] | None):
    """``open_translator`` for a folder ``attnmt export`` wrote: the model's decode settings with the same
    overrides, CTranslate2's search."""
    from ..decoding.ctranslate import Ct2Translator, read_export

    if ensemble:
        raise ConfigError(f"--ensemble: {folder} is a CTranslate2 export, which decodes alone; ensemble the "
                          "checkpoints instead")
    export = read_export(folder)
    _, cfg, tokenizer = export
    decode = overrides.apply(cfg.decode, tokenizer.tgt_vocab_size)
    translator = Ct2Translator(folder, decode, dev, overrides.sampling, export=export)
    translator.source_prefix = cfg.data.prefix_for(overrides.tgt_lang, overrides.named("tgt_lang"))
    return translator, cfg, Path(folder)


class FileProgress:
    """A progress bar on stderr (rich: sentences/s and the time left) for a command working through a
    file of ``total`` lines (None: a pipe, whose lines are not counted ahead: the count so far and the
    rate), shown only when stderr is a terminal and the input is a file (``show``); otherwise nothing at
    all, so pipes and logs stay as they were."""

    def __init__(self, total: int | None, what: str, show: bool = True, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (show and (total is None or total > 0)
                        and bool(getattr(self.stream, "isatty", lambda: False)()))
        self.total, self.what = total, what
        self._progress = self._task = None

    def __enter__(self) -> FileProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                      console=Console(file=self.stream), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.what, total=self.total, rate="")
            self._started = time.perf_counter()
        return self

    def advance(self, n: int) -> None:
        if self._progress is not None:
            task = self._progress.tasks[0]
            seconds = max(time.perf_counter() - self._started, 1e-9)
            self._progress.update(self._task, advance=n, rate=f"{(task.completed + n) / seconds:,.1f} sent/s")

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

"""What every command reads and writes, declared once where it is registered, and the checks that keep
"nothing lost" (``docs/RELIABILITY.md``) before any work is done.

A command declares its inputs (the options that name files or folders it reads: models, ensemble
members, sources, references, gold alignments, configs, run folders) and its outputs (``Output``: a file
or a folder, whether an existing one is replaced, which of a run folder's own paths it may write). Before
the command runs, ``check_options`` refuses, each with one line naming the option:

- a text argument whose bytes are not UTF-8 (``utf8_text``: arguments are read as UTF-8 whatever the
  locale, as files are);

- a number that is not finite, or an integer past what the libraries take (64 bits);
- an output that is an input (the same file by ``os.path.samestat``: through symbolic and hard links
  alike; a device or a pipe is never the same as another path), that lies inside an input folder, or
  that is another output of the same command;
- an output inside an attnmt run folder that is one of the run's own paths (``runfiles.RUN_OWNED``: its
  config, tokenizer, data, checkpoints, metrics) and not the command's to write;
- a file where a folder goes or a folder where a file goes, and an existing output that the command's
  contract does not replace (``Output.replaces``; an output that does is written atomically).

The checks look at names and ``stat`` results only: they read no file's contents.
"""

from __future__ import annotations

import fnmatch
import math
import os
import stat
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import typer

from ..errors import ConfigError, DataError

# Integers past these reach no library intact (torch and itertools take 64-bit signed values); an option
# with a range of its own (seeds: 0 .. 2**64 - 1) declares it with Typer's min and max.
INT_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Output:
    """What a command writes through one option."""

    folder: bool = False
    """A folder (figures, an export, a run folder) rather than a file."""
    replaces: bool = True
    """An existing file is replaced, atomically (an existing folder: its files of the same names); False: the
    output must be new (a folder: new or empty)."""
    own: tuple[str, ...] = ()
    """Paths inside a run folder (glob patterns relative to it) that are this output's to write although
    they are the run's own: ``plot-curves --out RUN/curves.png``."""
    run: bool = False
    """The run folder of ``prepare`` and ``train``: ``runfiles.RunLock`` checks and claims it."""


@dataclass(frozen=True)
class Declared:
    """One command's paths: the parameters it reads, and the parameters it writes with their contracts."""

    inputs: tuple[str, ...] = ()
    outputs: dict[str, Output] = field(default_factory=dict)


DECLARED: dict[str, Declared] = {}
"""Command name -> its declaration, filled as the commands register (``app.command``)."""


@dataclass(frozen=True)
class Param:
    """How the user spells a parameter (``--length-penalty`` for an option, ``MODEL`` for an argument), and
    the bounds it declares (Typer's min and max, which Click checks) in place of ``INT_RANGE``'s."""

    spelling: str
    low: float | None = None
    high: float | None = None


def parameters(function: Callable) -> dict[str, Param]:
    """Each parameter of a command function, from its Typer annotations."""
    found = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        metadata = getattr(hint, "__metadata__", ())
        info = next((m for m in metadata if isinstance(m, typer.models.ParameterInfo)), None)
        bounds = (getattr(info, "min", None), getattr(info, "max", None))
        if isinstance(info, typer.models.ArgumentInfo):
            found[name] = Param(name.rstrip("_").upper(), *bounds)
        else:
            declared = [d for d in getattr(info, "param_decls", None) or () if d.startswith("--")]
            spelling = declared[0] if declared else "--" + name.rstrip("_").replace("_", "-")
            found[name] = Param(spelling, *bounds)
    return found


def check_options(values: dict[str, object], declared: Declared,
                  params: dict[str, Param]) -> dict[str, object]:
    """Every check of this module on one command's parsed ``values``; a ConfigError names the option.
    Returns ``values`` with each text argument as the UTF-8 text its bytes spell (``utf8_text``)."""
    values = dict(values)
    for name, value in values.items():
        param = params.get(name, Param(name))
        for item in as_list(value):
            check_number(param, item)
        values[name] = utf8_text(param, value)
    check_paths(values, declared, {name: param.spelling for name, param in params.items()})
    return values


def utf8_text(param: Param, value: object) -> object:
    """A text argument (a string, or a list of them) as UTF-8 text, whatever the locale: attnmt reads its
    arguments as it reads its files. Python hands over an argument's bytes that the locale cannot decode as
    lone surrogates (``surrogateescape``: every non-ASCII byte under ``LC_ALL=C PYTHONUTF8=0``); their
    bytes, decoded as UTF-8, are what the user typed, and bytes that are not UTF-8 (``$'caf\\xe9'``, Latin-1)
    are a DataError naming the argument and the byte. Paths are left alone: a file name may be any bytes."""
    if isinstance(value, (list, tuple)):
        return type(value)(utf8_text(param, item) for item in value)
    if not isinstance(value, str) or isinstance(value, Enum) or not _has_surrogates(value):
        return value
    try:
        raw = os.fsencode(value)  # the argument's own bytes
    except UnicodeEncodeError:  # a surrogate no decoding made (a program's own string): not UTF-8 either
        raw = value.encode("utf-8", "surrogatepass")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = raw[:60].decode("utf-8", "backslashreplace") + ("..." if len(raw) > 60 else "")
        raise DataError(f"{param.spelling} \"{shown}\": invalid UTF-8 at byte offset {e.start} "
                        f"(0x{raw[e.start]:02x}); give text in UTF-8, whatever the locale") from None


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_number(param: Param, value: object) -> None:
    """Floats finite; integers within 64 bits, or within the bounds the option declares (bool is not a
    number here)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{param.spelling} {value}: expected a finite number")
    if isinstance(value, int) and not isinstance(value, bool):
        low = INT_RANGE[0] if param.low is None else param.low
        high = INT_RANGE[1] if param.high is None else param.high
        if not low <= value <= high:
            raise ConfigError(f"{param.spelling} {value}: out of range ({low:,} to {high:,})")


def check_paths(values: dict[str, object], declared: Declared, names: dict[str, str]) -> None:
    """The output rules of the module docstring, for every output option against every input option."""
    inputs = [(names[n], Path(p)) for n in declared.inputs for p in as_list(values.get(n))
              if p is not None and str(p) != "-"]
    seen: list[tuple[str, Path]] = []
    for name, output in declared.outputs.items():
        for path in as_list(values.get(name)):
            if path is None:
                continue
            path = Path(path)
            check_output(names[name], path, output, inputs)
            for other_flag, other in seen:
                if _same(path, other):
                    raise ConfigError(f"{names[name]} {path} is also {other_flag}; give each output its own "
                                      "path")
            seen.append((names[name], path))


def check_output(flag: str, path: Path, output: Output, inputs: Iterable[tuple[str, Path]]) -> None:
    """One output path against the rules (``Output`` says which apply)."""
    from ..runfiles import RUN_OWNED, enclosing_run, is_run_folder

    kind = _kind(path)
    if output.folder and kind == "file":
        raise ConfigError(f"{flag} {path} is a file; give a folder")
    if not output.folder and kind == "folder":
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    for input_flag, source in inputs:
        if _same(path, source):
            raise ConfigError(f"{flag} {path} is the same file as {input_flag} {source}; refusing to "
                              "overwrite the input")
        if not output.run and _inside(path, source) and not is_run_folder(source):
            raise ConfigError(f"{flag} {path} is inside the input folder {input_flag} {source}; refusing to "
                              "write into an input")
    if output.run:
        return  # RunLock checks the run folder itself
    run = enclosing_run(path)
    if run is not None:
        relative = Path(os.path.realpath(path)).relative_to(run)
        if relative.parts and relative.parts[0] in RUN_OWNED and not any(
                fnmatch.fnmatch(relative.as_posix(), pattern) for pattern in output.own):
            raise ConfigError(f"{flag} {path}: {relative.parts[0]} is the run folder {run}'s own (train and "
                              "prepare write it); give a path outside it")
    if not output.replaces and kind == "file":
        raise ConfigError(f"{flag} {path} exists; refusing to overwrite it (give a new name)")
    if not output.replaces and kind == "folder" and any(os.scandir(path)):
        raise ConfigError(f"{flag} {path} is a folder that is not empty; refusing to overwrite it (give a "
                          "new or empty folder)")


def as_list(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _kind(path: Path) -> str | None:
    """"file", "folder", "special" (a device or a pipe: written through, never replaced) or None (new)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special"


def _same(a: Path, b: Path) -> bool:
    """The same file or folder, through any link; a device or pipe is never "the same" as another path
    (``-i /dev/stdin -o /dev/stdout`` on one terminal loses nothing)."""
    try:
        first, second = os.stat(a), os.stat(b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
    regular = all(stat.S_ISREG(s.st_mode) or stat.S_ISDIR(s.st_mode) for s in (first, second))
    return regular and os.path.samestat(first, second)


def _inside(path: Path, folder: Path) -> bool:
    """``path`` lies under the folder ``folder`` (links resolved)."""
    if _kind(folder) != "folder":
        return False
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder)) and not _same(path, folder)

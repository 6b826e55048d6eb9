"""The command line's contract for the scripts (``docs/RELIABILITY.md``): every expected failure is one
``error:`` line on stderr and the exit code of its kind (2 usage, 3 data, 4 model, 5 resources, 130
Ctrl-C), never a traceback, and every input is checked before the first expensive step.

A script's ``build_parser()`` returns a ``ScriptParser`` whose options name what they take with the
checks here as their ``type=``: ``Number`` (finite, in a range, integers within 64 bits), ``InputFile``,
``InputFolder``, ``ConfigFile`` (loaded with attnmt's own ``load_config``), ``Model`` (a checkpoint, a run
folder or an export), ``OutputFile`` and ``OutputFolder``. ``parse_args`` then checks, before it returns,
what each path is on disk (names and ``stat`` only, and a config's few bytes), each output against every
input with the command line's own rules (``attnmt.cli.contract.check_paths``: not an input, not inside an
input folder, not another output), and last the script's own ``checks`` (a config's corpus kind, two
options that go together). Its usage errors are one line too. ``main`` is ``@guarded``: its first statement
is ``args = build_parser().parse_args(argv)``, and what it raises becomes the one line (``error_guard``,
the rules of ``attnmt/cli/app.py``'s). ``--debug``, which every script takes, prints the traceback first.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import math
import os
import stat
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnmt.errors import (
    OUT_OF_MEMORY,
    RESOURCE_ERRNOS,
    AttnmtError,
    CheckpointError,
    ConfigError,
    DataError,
    ResourceError,
    is_out_of_memory,
    os_error,
)

# Integers past 64 bits reach no library intact; a float option past them is a typo too.
INT_RANGE = (-(2**63), 2**63 - 1)


# ------------------------------------------------------------------------------------------ the guard


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {' '.join(message.splitlines())}\n")
    sys.stderr.flush()
    raise SystemExit(code)


# An OSError of these is the input's (a file that is not there, or not a file): exit 3.
MISSING_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})


@contextlib.contextmanager
def error_guard(debug: bool = False) -> Iterator[None]:
    """What the block raises, as one ``error:`` line and the contract's exit code (SystemExit), by the
    rules of ``attnmt.cli.app.error_guard``: an AttnmtError its own code; Ctrl-C 130; out of memory and an
    OSError of a resource (``errors.RESOURCE_ERRNOS``) 5; an OSError of a missing file 3 (both in
    ``errors.os_error``'s words); a broken pipe (``| head``) a quiet 0; anything else a bug, 1. With
    ``debug`` the traceback comes first (plain frames, never their local variables)."""
    try:
        yield
    except AttnmtError as e:
        _traceback_if(debug)
        fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        _traceback_if(debug)
        fail("interrupted (Ctrl-C)", 130)
    except BrokenPipeError:
        # The reader went away (`| head -1`): stop quietly, and keep Python from complaining when it
        # flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    except MemoryError:
        _traceback_if(debug)
        fail(OUT_OF_MEMORY, 5)
    except Exception as e:
        _traceback_if(debug)
        if is_out_of_memory(e):
            fail(OUT_OF_MEMORY, 5)
        if isinstance(e, OSError) and (e.errno in RESOURCE_ERRNOS or e.errno in MISSING_ERRNOS):
            path = os.fsdecode(e.filename) if e.filename is not None else None
            error = os_error(path, e, None, user_input=e.errno in MISSING_ERRNOS)
            fail(str(error), error.exit_code)
        first = str(e).splitlines()[0] if str(e) else ""
        fail(f"internal error: {type(e).__name__}: {first} (run with --debug for a traceback)", 1)


def _traceback_if(debug: bool) -> None:
    if debug:
        traceback.print_exc(file=sys.stderr)


def guarded(main: Callable[..., Any]) -> Callable[..., Any]:
    """``main(argv)`` inside ``error_guard`` (``--debug`` among the words: with the traceback)."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> Any:
        words = sys.argv[1:] if argv is None else list(argv)
        with error_guard(debug="--debug" in words):
            return main(argv)

    run.error_guard = True
    return run


# ------------------------------------------------------------------------------------------ the parser


class ScriptParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), every option's checks run by ``parse_args``, and the
    script's own ``checks`` (callables on the parsed namespace, in order) after them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments: list[argparse.Action] = []  # every add_argument, in order (help first)
        self.checks: list[Callable[[argparse.Namespace], None]] = []
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", help="on an error, print the traceback first")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and not args[0].startswith("-"):
            kwargs.setdefault("metavar", args[0].upper())  # an argument is MODEL in usage and in errors
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def error(self, message: str) -> None:
        fail(message.removeprefix("argument "), 2)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        checked = [(action, spelling(action)) for action in self.arguments if isinstance(action.type, Check)]
        for action, name in checked:
            for value in values_of(getattr(parsed, action.dest)):
                action.type.check(value, name, parsed)
        from attnmt.cli.contract import Declared, check_paths

        roles = {action.dest: action.type for action, _ in checked}
        declared = Declared(tuple(dest for dest, check in roles.items() if check.reads),
                            {dest: check.writes for dest, check in roles.items() if check.writes})
        check_paths(vars(parsed), declared, {action.dest: name for action, name in checked})
        for check in self.checks:
            check(parsed)
        return parsed


def spelling(action: argparse.Action) -> str:
    """How the user names an option (``-o/--output``) or an argument (``CONFIG``), as argparse does."""
    return "/".join(action.option_strings) or action.metavar or action.dest


def values_of(value: Any) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


# ------------------------------------------------------------------------------------------ the checks


class Check:
    """An argparse ``type=``: ``__call__`` turns the word into a value or refuses it (ArgumentTypeError:
    one usage line, exit 2); ``check`` then looks at what the value names on disk, once every option is
    parsed, and raises the AttnmtError of its kind. ``kind`` tells the contract test what to give it."""

    kind = ""
    reads = False  # an input, for the output checks
    writes = None  # an output: its ``attnmt.cli.contract.Output``

    def __call__(self, text: str) -> Any:
        return text

    def check(self, value: Any, name: str, args: argparse.Namespace) -> None:
        """Raise the AttnmtError of the kind of problem, naming the option; the default: nothing to see."""


class Number(Check):
    """An ``int`` or ``float`` that is finite and within ``low <= x <= high`` (``above``: ``x > above``);
    integers and floats alike within 64-bit integers unless ``high`` says less."""

    kind = "number"

    def __init__(self, type_: type = int, low: float | None = None, high: float | None = None,
                 above: float | None = None) -> None:
        self.type, self.low, self.above = type_, low, above
        self.high = INT_RANGE[1] if high is None else high
        if low is None and above is None:
            self.low = INT_RANGE[0]

    def __call__(self, text: str) -> int | float:
        what = "an integer" if self.type is int else "a number"
        try:
            value = self.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number")
        if not self.allows(value):
            raise argparse.ArgumentTypeError(f"{text}: expected {what} {self.range()}")
        return value

    def allows(self, value: float) -> bool:
        return ((self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and value <= self.high)

    def range(self) -> str:
        low = f"> {_number(self.above)}" if self.above is not None else f">= {_number(self.low)}"
        return f"{low} and <= {_number(self.high)}"


def _number(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


class _Path(Check):
    """A path: never the empty word (it would name the working folder)."""

    def __call__(self, text: str) -> Path:
        if not text:
            raise argparse.ArgumentTypeError("an empty path")
        return Path(text)


def _mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


class InputFile(_Path):
    """A file to read: it exists (else 3), it is a file (a folder: 2), it is readable (else 5). A pipe or a
    device (``/dev/stdin``) only with ``pipes=True``: for inputs read once, in this process."""

    kind, reads = "file", True

    def __init__(self, pipes: bool = False) -> None:
        self.pipes = pipes

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        mode = _mode(value)
        if mode is None:
            raise DataError(f"{name} {value}: no such file")
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{name} {value} is a folder; give a file")
        if not stat.S_ISREG(mode) and not self.pipes:
            raise ConfigError(f"{name} {value} is not a regular file (a pipe or a device?); this script "
                              "reads it more than once, so give a file on disk")
        if not os.access(value, os.R_OK):
            raise ResourceError(f"{name} {value}: permission denied")


class InputFolder(_Path):
    """A folder to read: it exists (else 3), it is a folder (else 2), it can be listed (else 5)."""

    kind, reads = "folder", True

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        mode = _mode(value)
        if mode is None:
            raise DataError(f"{name} {value}: no such folder")
        if not stat.S_ISDIR(mode):
            raise ConfigError(f"{name} {value} is not a folder")
        if not os.access(value, os.R_OK | os.X_OK):
            raise ResourceError(f"{name} {value}: permission denied")


class ConfigFile(_Path):
    """A config file that ``attnmt.config.schema.load_config`` loads (every error 2, as ``attnmt train`` gives
    it), with the overrides the script will give it: ``overrides(args)`` (the ``--set`` values and what
    the script adds)."""

    kind, reads = "config", True

    def __init__(self, overrides: Callable[[argparse.Namespace], list[str]] = lambda args: []) -> None:
        self.overrides = overrides

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        mode = _mode(value)
        if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            # load_config would wait on a pipe for its writer; a config is read again by each child
            raise ConfigError(f"{name} {value} is not a regular file (a pipe or a device?); give a file")
        from attnmt.config.schema import load_config

        try:
            load_config(value, self.overrides(args))
        except AttnmtError as e:
            e.args = (f"{name}: {e}",)
            raise


class Model(_Path):
    """A checkpoint file (unless ``checkpoints=False``) or a run folder (``exports=True``: or a folder
    ``attnmt export`` wrote), by its names only: what ``checkpoint.resolve_model_path`` refuses is refused
    here (exit 4) before any load."""

    kind, reads = "model", True

    def __init__(self, exports: bool = False, checkpoints: bool = True) -> None:
        self.exports, self.checkpoints = exports, checkpoints

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        from attnmt.decoding.ctranslate import is_export
        from attnmt.runfiles import is_run_folder

        mode = _mode(value)
        if mode is None:
            raise CheckpointError(f"{name} {value}: no such checkpoint or run folder")
        if stat.S_ISDIR(mode):
            export = is_export(value)
            if export and not self.exports:
                raise CheckpointError(f"{name} {value}: a CTranslate2 export; give the checkpoint or run "
                                      "folder it was exported from")
            if not export and not is_run_folder(value):
                raise CheckpointError(f"{name} {value}: not an attnmt run folder (no attnmt-run.json), "
                                      "checkpoint or export")
        elif not stat.S_ISREG(mode):
            raise CheckpointError(f"{name} {value}: not a file or a folder (a pipe?); a checkpoint is read "
                                  "from disk")
        elif not self.checkpoints:
            raise CheckpointError(f"{name} {value}: a file; give a run folder")
        if not os.access(value, os.R_OK):
            raise ResourceError(f"{name} {value}: permission denied")


class OutputFile(_Path):
    """A file to write (replaced if it exists): not a folder, in a folder that exists and is writable; a
    pipe or a device (``/dev/stdout``) is written through. Not an input (``ScriptParser.parse_args``)."""

    kind = "output-file"

    def __init__(self) -> None:
        from attnmt.cli.contract import Output

        self.writes = Output(folder=False, replaces=True)

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        mode = _mode(value)
        if mode is not None and stat.S_ISDIR(mode):
            raise ConfigError(f"{name} {value} is a folder; give a file name")
        if mode is None:
            parent = value.parent
            if _mode(parent) is None or not stat.S_ISDIR(_mode(parent)):
                raise ConfigError(f"{name} {value}: no folder {parent} to write it in")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ResourceError(f"{name} {value}: permission denied in {parent}")
        elif not os.access(value, os.W_OK):
            raise ResourceError(f"{name} {value}: permission denied")


class OutputFolder(_Path):
    """A folder to write in, made with its parents when new: not a file, and the nearest folder that
    exists above it writable. Not an input (``ScriptParser.parse_args``)."""

    kind = "output-folder"

    def __init__(self) -> None:
        from attnmt.cli.contract import Output

        self.writes = Output(folder=True, replaces=True)

    def check(self, value: Path, name: str, args: argparse.Namespace) -> None:
        mode = _mode(value)
        if mode is not None and not stat.S_ISDIR(mode):
            raise ConfigError(f"{name} {value} is not a folder; give a new or existing folder")
        existing = next(p for p in (value.absolute(), *value.absolute().parents) if _mode(p) is not None)
        if not stat.S_ISDIR(_mode(existing)):
            raise ConfigError(f"{name} {value}: {existing} is not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ResourceError(f"{name} {value}: permission denied in {existing}")


class Pattern(Check):
    """A word that matches ``regex`` (``description`` says how, in the usage error)."""

    kind = "text"

    def __init__(self, regex: str, description: str) -> None:
        import re

        self.regex, self.description = re.compile(regex), description

    def __call__(self, text: str) -> str:
        if not self.regex.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {self.description}")
        return text


def require_module(module: str, why: str) -> None:
    """A ConfigError (2, as attnmt's missing extras are) unless ``module`` can be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(why)

"""The Typer application, its global options, and ``command``: the one decorator that registers a command
and applies the error guard.

The contract (``docs/RELIABILITY.md``): every expected failure is an ``AttnmtError`` raised by library
code, and the guard turns it into one ``error:`` line on stderr and the exit code of its class
(``errors.py``); a usage error Click finds (a bad option value, a missing argument) is one line too, exit
2. An operating system's error that is a resource (a full disk, a file-size limit, a read-only file
system, permission denied, too many open files, out of memory: ``errors.RESOURCE_ERRNOS``) that escaped
the library's own mapping is one line too, exit 5, naming its file (or the command's outputs). Anything
else is a bug: one line, exit 1. ``--debug`` adds the traceback before the line (never the frames' local
variables) and keeps the exit code. Python warnings from libraries (torch, sentencepiece, ...) go to the
log at DEBUG, shown only with ``--debug``: they never add a line beside the contract's one. Heavy
libraries are imported inside the commands so that ``attnmt --help`` stays fast and never touches the
network.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ..errors import (
    LOADING_OUT_OF_MEMORY,
    RESOURCE_ERRNOS,
    AttnmtError,
    is_out_of_memory,
    memory_message,
    os_error,
)
from .contract import DECLARED, Declared, Output, Param, as_list, check_options, parameters
from .runtime import settle_process


class _OneLineErrors(TyperGroup):
    """Typer's group with Click's usage errors as one ``error:`` line instead of a panel."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # Click's usage errors (Typer carries its own Click)
            if type(e).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
                where = f" (see {e.ctx.command_path} --help)" if getattr(e, "ctx", None) is not None else ""
                # pydantic's prefix, from Typer's coercion
                message = e.format_message().replace("Value error, ", "").replace("\n", " ")
                sys.stderr.write(f"error: {message}{where}\n")
            sys.exit(e.exit_code)
        except typer.Abort:
            sys.stderr.write("Aborted!\n")
            sys.exit(1)
        except (MemoryError, ImportError) as e:  # outside a command's guard (parsing, the help), or in it
            if not _exit_out_of_memory(e):
                raise
        sys.exit(code if isinstance(code, int) else 0)


# Made while there was memory: the last line when even the message cannot be made.
_LAST_LINE = f"error: {LOADING_OUT_OF_MEMORY}\n".encode()


def _exit_out_of_memory(error: BaseException) -> bool:
    """Exit 5 with the one line of ``error`` if it is memory that ran out (else False). Written with
    ``os.write``; where nothing more can be allocated (the guard's own line failed), ``_LAST_LINE`` and
    ``os._exit``: a traceback of MemoryErrors, and then glibc spinning for a new arena, is what it was."""
    try:
        if not is_out_of_memory(error):
            return False
        if not _state["said"]:  # the guard's line went out, and the memory ran out after it
            os.write(2, f"error: {memory_message(error)}\n".encode())
    except MemoryError:
        os.write(2, _LAST_LINE)
        os._exit(5)
    sys.exit(5)


app = typer.Typer(
    name="attnmt",
    cls=_OneLineErrors,
    help="Train, decode, score and look inside attention-based neural machine translation models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)

_state = {"debug": False, "said": False}  # said: this invocation's error line is written


def _print_version(value: bool) -> None:
    # Eager, so that it runs while parsing: `attnmt --version` has no command for the callback to wait for.
    if value:
        from .. import __version__

        typer.echo(f"attnmt {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show a full traceback on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _state["debug"], _state["said"] = debug, False
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
    warnings.showwarning = _log_warning
    logging.raiseExceptions = False  # a log line that cannot be written (a full disk) prints no traceback
    logging.getLogger("py.warnings").setLevel(logging.DEBUG if debug else logging.WARNING)
    # Over the file-size limit (RLIMIT_FSIZE) a write fails with EFBIG, which the contract reports, instead of
    # SIGXFSZ killing the process (Python ignores it at start already; a program that embeds attnmt may not).
    with contextlib.suppress(ValueError):  # not the main thread: signals are not its to set
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the command line: a library's warning is a DEBUG record of the log
    (shown with ``--debug``), never a line of its own on stderr beside the contract's one."""
    logging.getLogger("py.warnings").debug("%s: %s (%s:%s)", category.__name__, message, filename, lineno)


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    _state["said"] = True
    raise typer.Exit(code)


def _traceback_if_debug() -> None:
    """With ``--debug``: the traceback of the exception being handled, before its one error line (plain
    Python frames, never their local variables); the exit code stays the contract's."""
    if _state["debug"]:
        import traceback

        traceback.print_exc(file=sys.stderr)


def os_error_line(error: OSError, writing: list[str]) -> str:
    """The one line of an operating system's resource error that no library code mapped: its file, or
    (a full disk or a file-size limit that names none: a write of a buffered file) the outputs the command
    was writing (``writing``: "--out PATH", ...)."""
    if error.filename is not None:
        name = error.filename
        return str(os_error(os.fsdecode(name) if isinstance(name, (str, bytes)) else str(name), error, None))
    cause = str(os_error(None, error, None))
    if writing and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{', '.join(writing)}: cannot write: {cause}"
    return cause


@contextlib.contextmanager
def error_guard(writing: list[str] | None = None) -> Iterator[None]:
    """Map whatever a command raises to the exit-code contract; ``writing``: the outputs the command was
    given ("--out PATH"), for an error that names no file."""
    try:
        yield
    except AttnmtError as e:
        _traceback_if_debug()
        cause = e.__cause__ or e.__context__  # what the library caught: memory, not a corrupt file
        if e.exit_code != 5 and cause is not None and is_out_of_memory(cause):
            fail(memory_message(cause), 5)
        fail(str(e).replace("\n", " "), e.exit_code)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining at exit
        # when it flushes stdout. Caught here, before `Exception` would report it as an internal error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as e:  # MemoryError included
        _traceback_if_debug()
        if is_out_of_memory(e):
            fail(memory_message(e), 5)
        if isinstance(e, OSError) and e.errno in RESOURCE_ERRNOS:  # the shared net: a place not mapped yet
            fail(os_error_line(e, writing or []), 5)
        first = str(e).splitlines()[0] if str(e) else ""
        fail(f"internal error: {type(e).__name__}: {first} (run with --debug for a traceback)", 1)


def command(name: str | None = None, inputs: tuple[str, ...] = (), outputs: dict[str, Output] | None = None,
            **options: Any) -> Callable[[Callable], Callable]:
    """Register the decorated function as the command ``name`` (default: its own name), run inside
    ``error_guard`` after ``contract.check_options``: ``inputs`` names the parameters whose files or
    folders the command reads, ``outputs`` the parameters it writes, each with its ``Output`` contract."""

    def register(function: Callable) -> Callable:
        declared = Declared(tuple(inputs), dict(outputs or {}))
        DECLARED[name or function.__name__.replace("_", "-")] = declared
        params: dict[str, Param] = {}  # read from the annotations on the first call (--help needs none)

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> None:
            writing: list[str] = []
            with error_guard(writing):
                settle_process()  # before anything heavy is imported (runtime.py)
                params.update(params or parameters(function))
                kwargs = check_options(kwargs, declared, params)
                writing += [f"{params[name].spelling} {path}" for name in declared.outputs
                            for path in as_list(kwargs.get(name)) if path is not None]
                function(*args, **kwargs)

        app.command(name, **options)(guarded)
        return function

    return register

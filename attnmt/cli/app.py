"""The Typer application, its global options, and ``command``: the one decorator that registers a command
and applies the error guard.

The contract (``docs/RELIABILITY.md``): every expected failure is an ``AttnmtError`` raised by library
code, and the guard turns it into one ``error:`` line on stderr and the exit code of its class
(``errors.py``); a usage error Click finds (a bad option value, a missing argument) is one line too, exit
2. Anything else is a bug: one line, exit 1. ``--debug`` adds the traceback before the line (never the
frames' local variables) and keeps the exit code. Heavy libraries are imported inside the commands so
that ``attnmt --help`` stays fast and never touches the network.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ..errors import OUT_OF_MEMORY, AttnmtError, is_out_of_memory
from .contract import DECLARED, Declared, Output, Param, check_options, parameters


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
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="attnmt",
    cls=_OneLineErrors,
    help="Train, decode, score and look inside attention-based neural machine translation models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)

_state = {"debug": False}


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


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def _traceback_if_debug() -> None:
    """With ``--debug``: the traceback of the exception being handled, before its one error line (plain
    Python frames, never their local variables); the exit code stays the contract's."""
    if _state["debug"]:
        import traceback

        traceback.print_exc(file=sys.stderr)


@contextlib.contextmanager
def error_guard() -> Iterator[None]:
    """Map whatever a command raises to the exit-code contract."""
    try:
        yield
    except AttnmtError as e:
        _traceback_if_debug()
        fail(str(e).replace("\n", " "), e.exit_code)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining at exit
        # when it flushes stdout. Caught here, before `Exception` would report it as an internal error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except MemoryError:
        _traceback_if_debug()
        fail(OUT_OF_MEMORY, 5)
    except Exception as e:
        _traceback_if_debug()
        if is_out_of_memory(e):
            fail(OUT_OF_MEMORY, 5)
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
            with error_guard():
                params.update(params or parameters(function))
                check_options(kwargs, declared, params)
                function(*args, **kwargs)

        app.command(name, **options)(guarded)
        return function

    return register

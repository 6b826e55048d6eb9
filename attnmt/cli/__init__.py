"""The ``attnmt`` command line: the only package that prints, uses rich or chooses exit codes.

``app.py`` holds the Typer application and the ``command`` decorator with the error guard; one module per
family of commands registers its commands on import:

- ``training.py``: prepare, toy-data, train, distill (``reporting.py`` shows them);
- ``decoding.py``: translate, eval, score;
- ``looking.py``: plot, align, plot-curves;
- ``attributing.py``: attribute;
- ``heads.py``: heads;
- ``studying.py``: study;
- ``model_tools.py``: average, export, import, info, shortlist.

A command parses its options, makes one library call and prints. ``options.py`` holds the option types
the commands share, ``common.py`` their input, output and model-loading helpers.
"""

import os

try:
    # Each module registers its commands on import, and `attnmt --help` lists them in this order.
    # isort: off
    from . import training, decoding, looking, attributing, heads, studying, serving, model_tools  # noqa: F401
    from .app import app

    # isort: on
except (MemoryError, ImportError) as e:  # before any command's guard: a memory limit too low to load typer
    from ..errors import is_out_of_memory, memory_message

    if not is_out_of_memory(e):
        raise
    os.write(2, f"error: {memory_message(e)}\n".encode())  # no stream to build: memory is short
    raise SystemExit(5) from None

__all__ = ["app"]

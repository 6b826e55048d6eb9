"""The ``attnmt`` command line: the only package that prints, uses rich or chooses exit codes.

``app.py`` holds the Typer application and the ``command`` decorator with the error guard; one module per
family of commands registers its commands on import:

- ``training.py``: prepare, toy-data, train (``reporting.py`` shows them);
- ``decoding.py``: translate, eval, score;
- ``looking.py``: plot, align, plot-curves;
- ``attributing.py``: attribute;
- ``heads.py``: heads;
- ``studying.py``: study;
- ``model_tools.py``: average, info.

A command parses its options, makes one library call and prints. ``options.py`` holds the option types
the commands share, ``common.py`` their input, output and model-loading helpers.
"""

# Each module registers its commands on import, and `attnmt --help` lists them in this order.
# isort: off
from . import training, decoding, looking, attributing, heads, studying, serving, model_tools  # noqa: F401
from .app import app

# isort: on

__all__ = ["app"]

"""The reference pages' generators: each turns a part of attnmt's code into Markdown at build time, so the
reference cannot drift from the code (``docs/hooks/reference.py`` calls them, never a person).

- ``cli``: the Typer app's commands, for mkdocs-click (a real Click tree mirrored from Typer's own);
- ``config``: every key of the pydantic schema with its type, default and attribute docstring;
- ``errors``: the exit codes and error classes of ``attnmt/errors.py``;
- ``server_api``: the FastAPI application's OpenAPI document, rendered.

This folder is on ``sys.path`` while MkDocs builds (the hook puts it there) and in the docs tests.
"""

from __future__ import annotations

from collections.abc import Callable


def generators() -> dict[str, Callable[[], str]]:
    """The name a page's marker (``<!-- generated: NAME -->``) gives, and the function that writes it."""
    from . import cli, config, errors, server_api

    return {"commands": cli.markdown, "config": config.markdown, "errors": errors.markdown,
            "server-api": server_api.markdown}

"""MkDocs hook (``mkdocs.yml``'s ``hooks:``): the reference pages are completed from the code at build time.

A page of ``docs/reference/`` holds its hand-written introduction and a marker line
``<!-- generated: NAME -->``; ``on_page_markdown`` replaces the marker with what the generator ``NAME`` of
``docs/hooks/attnmt_docs`` writes from the code (the commands, the config schema, the errors, the server's
OpenAPI document). Nothing is written into ``docs/``, so ``mkdocs serve`` does not rebuild in a loop; it
watches ``attnmt/`` (``mkdocs.yml``'s ``watch:``) and each rebuild imports the code afresh.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

HERE = Path(__file__).resolve().parent
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->[ \t]*$", re.MULTILINE)


def on_config(config):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # attnmt_docs, for this hook and for mkdocs-click's :module:
    # Under `mkdocs serve`, a rebuild after a change to the code must see the change: forget what an earlier
    # build imported (the package and the generators; third-party libraries stay loaded).
    for name in [n for n in sys.modules if n.split(".")[0] in ("attnmt", "attnmt_docs")]:
        del sys.modules[name]
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- generated:" not in markdown:
        return markdown
    from attnmt_docs import generators

    known = generators()

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in known:
            raise PluginError(f"{page.file.src_uri}: no generator {name!r} "
                              f"(known: {', '.join(sorted(known))})")
        return known[name]()

    return MARKER.sub(fill, markdown)


def on_page_content(html: str, page, config, files) -> str:
    # mkdocs-click writes a required option's default as "_required" (a Markdown emphasis left open).
    return html.replace("<td>_required</td>", "<td><em>required</em></td>")

"""``heads --html``: one self-contained page (inline CSS and JavaScript, offline, from a ``file://`` URL) with
every head of a Transformer: a small heatmap per head of one sentence's maps, coloured by the head's pattern,
a legend, the pattern counts per kind, the pruning results and the table of every head. No torch.

Letters: L layers, H heads, T query positions (rows), S key positions (columns).

Everything the page shows is JSON in a ``<script type="application/json">`` element, with ``<``, ``>`` and
``&`` written as ``\\u003c``-style escapes (``explorer.script_json``), and is put into the page with
``textContent`` only; the heatmaps are drawn on canvases by the page's script (a cell per weight, from white
at 0 to the pattern's colour at 1, weights rounded to 3 decimals). The Content-Security-Policy is the
explorer's: nothing but the page's own inline code and ``data:`` images. Style and script are package
files, ``web/heads.css``, ``web/heads_body.html`` and ``web/heads.js``.

What the page's DOM offers (tests rely on these ids and classes):

- ``#heads-legend``: one ``.legend-item`` per pattern (``data-pattern``, ``data-count``), each with a
  ``.swatch`` in the pattern's colour;
- ``#heads-counts`` (pattern counts per kind), ``#heads-pruning`` (a row per pruning, ``data-fraction``,
  ``data-how``: ``importance`` or ``random``), ``#heads-summary``, ``#heads-sentence``;
- ``#heads-maps``: a ``section.kind`` (``data-kind``) per attention kind, holding one ``figure.head-map``
  per head (``data-kind``, ``data-layer``, ``data-head`` from 1, ``data-pattern``, ``data-rows``,
  ``data-cols``) whose border is the pattern's colour and whose ``canvas`` is the map;
- ``#heads-tooltip``: what the pointer is over, e.g. ``cross L2 H1: Fahrrad → bicycle 0.734``;
- ``#heads-table``: a header row, then a row per head (``data-pattern``), in the report's order;
- ``window.headsReady`` (``performance.now()`` when everything is drawn), ``window.headsError``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..runfiles import atomic_write_bytes
from .explorer import script_json
from .head_patterns import BLOCK_MIN, DISPERSED_MIN, KINDS, PATTERNS, POSITIONAL_MIN, STRIPE_MIN, WINDOW

KIND_NAMES = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention",
              "cross": "cross-attention"}
# Which piece sequence labels the rows (queries) and the columns (keys) of each kind (``Sample``'s fields).
KIND_AXES = {"enc_self": ("src", "src"), "dec_self": ("tgt_in", "tgt_in"), "cross": ("tgt", "src")}
RULES = {
    "diagonal": f"mean weight on its own position p(i) >= {POSITIONAL_MIN}",
    "previous": f"mean weight on p(i) - 1 >= {POSITIONAL_MIN}",
    "next": f"mean weight on p(i) + 1 >= {POSITIONAL_MIN}",
    "stripe": f"mass on BOS, EOS and punctuation >= {STRIPE_MIN}",
    "block": f"mass within |j - p(i)| <= {WINDOW}, above a uniform row's share there, >= {BLOCK_MIN}",
    "dispersed": f"entropy / log(keys) >= {DISPERSED_MIN}",
    "long-range": "none of the above: concentrated, away from its own position",
}


@dataclass
class Sample:
    """One pair's maps: its input line (1-based), the pieces that label them (``src`` and ``tgt`` end with
    EOS, ``tgt_in`` starts with BOS) and, per kind, one (H, rows, cols) array per layer (``KIND_AXES``)."""

    number: int
    src: list[str]
    tgt: list[str]
    tgt_in: list[str]
    maps: dict[str, list[np.ndarray]]


def _sample_json(sample: Sample | None) -> dict | None:
    if sample is None:
        return None
    sides = {"src": list(sample.src), "tgt": list(sample.tgt), "tgt_in": list(sample.tgt_in)}
    maps = {}
    for kind in KINDS:
        if kind not in sample.maps:
            continue
        rows, cols = (len(sides[side]) for side in KIND_AXES[kind])
        layers = []
        for k, layer in enumerate(sample.maps[kind]):
            layer = np.nan_to_num(np.asarray(layer, dtype=np.float64))
            if layer.ndim != 3 or layer.shape[1:] != (rows, cols):
                raise ValueError(f"sentence {sample.number}: {kind} layer {k + 1} has shape {layer.shape}, "
                                 f"expected (H, {rows}, {cols})")
            layers.append(np.round(layer, 3).tolist())
        maps[kind] = layers
    return {"number": int(sample.number), **sides, "maps": maps}


def heads_html(report: dict, sample: Sample | None, title: str = "attnmt heads") -> str:
    """The page for ``report`` (``heads.HeadsReport.as_dict``) and the maps of ``sample``."""
    data = {"title": title, "report": report, "sample": _sample_json(sample), "patterns": list(PATTERNS),
            "rules": RULES, "kinds": [[kind, KIND_NAMES[kind]] for kind in KINDS], "axes": KIND_AXES}
    heading = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<title>{heading}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{heading}</h1>\n{_BODY}"
        f"<script id=\"heads-data\" type=\"application/json\">{script_json(data)}</script>\n"
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_heads_page(path: Path, report: dict, sample: Sample | None, title: str = "attnmt heads") -> int:
    """Write ``heads_html`` to ``path`` atomically; returns the bytes written."""
    data = heads_html(report, sample, title).encode("utf-8")
    atomic_write_bytes(Path(path), data)
    return len(data)


_PAGE = resources.files("attnmt") / "web"
_STYLE = (_PAGE / "heads.css").read_text(encoding="utf-8")
_BODY = (_PAGE / "heads_body.html").read_text(encoding="utf-8")
_SCRIPT = (_PAGE / "heads.js").read_text(encoding="utf-8")

"""The attention explorer: one self-contained HTML page (inline CSS and JavaScript, the weights embedded)
to look through the attention of many sentences in a browser, offline, opened from a ``file://`` URL.

Letters: L layers, H heads, T query positions (rows), S key positions (columns), P pieces, W words.

The page holds, for each sentence, every layer and head of the kinds given (``cross``: rows are target
pieces, columns source pieces; ``enc_self``: source by source; ``dec_self``: ``<s>`` + target by the same),
and draws one (T, S) map at a time: a layer's head, or the mean of its heads ("avg", the default, with the
last layer). Two views: a heatmap (a cell per weight, viridis on a fixed 0..1 scale) and lines (keys on the
left, queries on the right, a line per pair whose opacity is the weight; pairs under 0.002 are not drawn).
The word view merges pieces into words in the page exactly as ``words.merge`` does: with membership
matrices Mr (row pieces x row words) and Mc (column pieces x column words) from ``words.piece_words``,
``W_words = (Mr^T W Mc) / colsum(Mr)`` (key pieces summed with their share, query pieces averaged). In the
word view of cross-attention the predicted word alignment is drawn on top; with gold links each link is a
sure hit (predicted and sure), a possible hit (predicted, possible but not sure), false (predicted, not
possible) or missed (sure, not predicted), and the sentence's AER is shown.

Size: weights are quantised to uint8 (w * 255 rounded: a step of 1/255, an error of at most 0.002; the
head average is the mean of the quantised heads), concatenated in one buffer (per sentence, kind, layer:
(H, T, S) in C order), deflated with zlib and embedded as base64; the page inflates it with the browser's
``DecompressionStream("deflate")``. Labels and everything else are JSON in a ``<script
type="application/json">`` element, with ``<``, ``>`` and ``&`` written as ``\\u003c``-style escapes, and
are put into the page with ``textContent`` only, so no label can close the script or add markup. A
Content-Security-Policy allows nothing but the page's own inline code and ``data:`` images.

What the page's DOM offers (tests and scripts rely on these ids and classes):

- controls: ``#explorer-sentence`` (a select, value = sentence index from 0), ``#explorer-prev``,
  ``#explorer-next`` (buttons; also the left and right arrow keys), ``#explorer-kind`` (values ``cross``,
  ``enc_self``, ``dec_self``: the kinds the sentence has), ``#explorer-layer`` (values ``0``..``L-1``),
  ``#explorer-head`` (values ``avg``, ``0``..``H-1``), ``#explorer-view`` (``heatmap``, ``lines``),
  ``#explorer-units`` (``pieces``, ``words``);
- the sentence: ``#explorer-number``, ``#explorer-src``, ``#explorer-tgt`` (text), ``#explorer-aer``
  (``AER 0.250``, empty without gold), ``#explorer-legend`` (hidden unless links are drawn; one
  ``.legend-item`` per class, with ``data-class`` and ``data-count``), ``#explorer-axes`` (which
  sequence the rows and columns are);
- ``#explorer-share`` (hidden unless the kind has shares): ``#explorer-share-line``, an SVG with one
  ``.share-point`` per target piece (``data-row``, ``data-share``: the source's share in that prediction,
  4 decimals) joined by a ``.share-polyline``;
- ``#explorer-tooltip``: what the pointer is over, e.g. ``Fahrrad → bicycle: 0.734`` (key → query, 3
  decimals) for a cell or line, or a token's weights for a label;
- heatmap: ``#explorer-heatmap`` with ``data-rows``, ``data-cols``; ``.col-label`` (``data-col``),
  ``.row-label`` (``data-row``), ``.cell`` (``data-row``, ``data-col``, ``data-w``: the drawn weight, 6
  decimals);
- lines: ``#explorer-lines`` with ``data-rows``, ``data-cols``; ``.line-key`` (``data-col``),
  ``.line-query`` (``data-row``), ``.attn-line`` (``data-row``, ``data-col``, ``data-w``), ``.align-line``;
- alignment classes on ``.cell`` and ``.align-line``: ``link`` and one of ``link-sure``,
  ``link-possible``, ``link-false``, ``link-missed`` (with gold) or ``link-predicted`` (without);
- ``window.attnmtExplorer.show(data, weights, bytes)``: draw other data (``pack``'s three fields, what
  ``attnmt serve``'s ``/attention`` answers) in the same controls; the page calls it with what it embeds;
- ``window.explorerReady`` (``performance.now()`` when the first map is drawn), ``window.explorerDraws``
  and ``body[data-draws]`` (maps drawn so far), ``window.explorerError`` (a message, when the page
  could not start).
"""

from __future__ import annotations

import base64
import html
import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..data.words import membership_of, piece_words
from ..runfiles import atomic_write_bytes

# What a prediction owes its inputs, each as a source kind and a prefix kind (one layer of one head): a
# gradient attribution, ALTI+, attention rollout and attention flow.
SHARE_KINDS = {"attribution": "attribution", "alti": "ALTI+", "rollout": "rollout", "flow": "flow"}
KINDS = ("align", "cross", "enc_self", "dec_self", *(k + end for k in SHARE_KINDS for end in ("", "_prefix")))
KIND_NAMES = {"cross": "cross-attention", "align": "alignment layer", "enc_self": "encoder self-attention",
              "dec_self": "decoder self-attention",
              **{k + end: f"{name}: {side}" for k, name in SHARE_KINDS.items()
                 for end, side in (("", "source"), ("_prefix", "prefix"))}}
# Which piece sequence labels the rows (queries) and the columns (keys) of each kind.
KIND_AXES = {"cross": ("tgt", "src"), "align": ("tgt", "src"), "enc_self": ("src", "src"),
             "dec_self": ("tgt_in", "tgt_in"),
             **{k + end: ("tgt", side) for k in SHARE_KINDS
                for end, side in (("", "src"), ("_prefix", "tgt_in"))}}
LEVELS = 255  # uint8 quantisation: w -> round(w * LEVELS)


@dataclass
class ExplorerSentence:
    """One sentence's attention for the page. ``maps[kind]`` holds one (H, rows, cols) array per layer:
    ``cross`` (always present) is (H, len(tgt), len(src)), ``enc_self`` (H, len(src), len(src)),
    ``dec_self`` (H, len(tgt_in), len(tgt_in)); what a prediction owes its inputs (``SHARE_KINDS``: a gradient
    attribution, ALTI+, rollout, flow) is one layer of one head, e.g. ``attribution`` (1, len(tgt), len(src))
    and ``attribution_prefix`` (1, len(tgt), len(tgt_in)). Links are
    (source word, target word) in the word indices of ``piece_words(src)`` and ``piece_words(tgt)``, or of
    ``src_words`` / ``tgt_words`` when given: (a
    membership matrix (pieces, words) whose rows sum to 1, the word labels), the words a caller read the
    pieces as (``attnmt align`` takes pre-segmented CJK text's words as given); ``possible`` includes
    ``sure``."""

    number: int
    src: list[str]
    tgt: list[str]
    tgt_in: list[str]
    maps: dict[str, list[np.ndarray]]
    links: list[tuple[int, int]] | None = None
    sure: set[tuple[int, int]] | None = None
    possible: set[tuple[int, int]] | None = None
    aer: float | None = None
    src_words: tuple[np.ndarray, list[str]] | None = None
    tgt_words: tuple[np.ndarray, list[str]] | None = None
    shares: dict[str, Sequence[float]] | None = None
    """Per kind of ``SHARE_KINDS`` on the page: each prediction's source share (a value per row of
    ``tgt``), drawn as a line over the sentence."""


def quantise(weights: np.ndarray) -> np.ndarray:
    """Weights in 0..1 -> uint8 0..255 (NaN as 0, values outside 0..1 clipped)."""
    weights = np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0)
    return np.rint(np.clip(weights, 0.0, 1.0) * LEVELS).astype(np.uint8)


def _members(pieces: Sequence[str], given: tuple[np.ndarray, list[str]] | None = None) -> dict:
    """The words of a piece sequence for the page (``given``, else ``piece_words``'): labels, and for each
    piece its words with their share (a plain word index when the piece belongs to one word whole, else
    ``[[word, share], ...]``)."""
    if given is not None:
        matrix, labels = np.asarray(given[0], dtype=np.float64), list(given[1])
        if matrix.shape != (len(pieces), len(labels)):
            raise ValueError(f"word membership of shape {matrix.shape} for {len(pieces)} pieces and "
                             f"{len(labels)} words")
    else:
        spec, labels = piece_words(pieces)
        matrix = membership_of(spec, len(pieces))  # (P, W)
    members: list = []
    for row in matrix:
        (words,) = np.nonzero(row)
        if len(words) == 1 and row[words[0]] == 1.0:
            members.append(int(words[0]))
        else:
            members.append([[int(w), float(row[w])] for w in words])
    return {"labels": labels, "members": members}


def _links(links) -> list[list[int]] | None:
    return None if links is None else [[int(i), int(j)] for i, j in sorted(links)]


def _payload(sentences: Sequence[ExplorerSentence]) -> tuple[list[dict], bytes]:
    """The JSON part of the page (one dict per sentence) and the quantised weights, uncompressed."""
    chunks: list[bytes] = []
    offset = 0
    entries = []
    for s in sentences:
        if "cross" not in s.maps:
            raise ValueError(f"sentence {s.number}: no cross-attention (maps has {sorted(s.maps)})")
        unknown = set(s.maps) - set(KINDS)
        if unknown:
            raise ValueError(f"sentence {s.number}: unknown attention kinds {sorted(unknown)}; "
                             f"expected {', '.join(KINDS)}")
        sides = {"src": list(s.src), "tgt": list(s.tgt), "tgt_in": list(s.tgt_in)}
        maps = {}
        for kind in KINDS:
            if kind not in s.maps:
                continue
            rows, cols = (len(sides[side]) for side in KIND_AXES[kind])
            layers = [np.asarray(layer) for layer in s.maps[kind]]
            if not layers:
                raise ValueError(f"sentence {s.number}: {kind} has no layers")
            heads = layers[0].shape[0] if layers[0].ndim == 3 else 0
            for k, layer in enumerate(layers):
                if layer.shape != (heads, rows, cols) or heads == 0:
                    row_side, col_side = KIND_AXES[kind]
                    raise ValueError(f"sentence {s.number}: {kind} layer {k + 1} has shape {layer.shape}, "
                                     f"expected ({heads or 'H'}, {rows}, {cols}) for {len(sides[row_side])} "
                                     f"{row_side} and {len(sides[col_side])} {col_side} pieces")
                chunks.append(quantise(layer).tobytes())
            maps[kind] = {"layers": len(layers), "heads": heads, "rows": rows, "cols": cols, "offset": offset}
            offset += len(layers) * heads * rows * cols
        given = {"src": s.src_words, "tgt": s.tgt_words, "tgt_in": None}
        words = {side: _members(pieces, given[side]) for side, pieces in sides.items()}
        n_src, n_tgt = len(words["src"]["labels"]), len(words["tgt"]["labels"])
        for name, links in (("links", s.links), ("sure", s.sure), ("possible", s.possible)):
            outside = sorted((i, j) for i, j in links or () if not (0 <= i < n_src and 0 <= j < n_tgt))
            if outside:
                i, j = outside[0]
                raise ValueError(f"sentence {s.number}: {name} link {i}-{j} is outside the pair "
                                 f"({n_src} source words, {n_tgt} target words)")
        gold = s.possible is not None or s.sure is not None
        possible = set(s.possible or ()) | set(s.sure or ()) if gold else None
        aer = None if s.aer is None or not math.isfinite(s.aer) else float(s.aer)
        shares = {}
        for kind, values in (s.shares or {}).items():
            if kind not in SHARE_KINDS or len(values) != len(s.tgt):
                raise ValueError(f"sentence {s.number}: shares of {kind!r}: {len(values)} values for "
                                 f"{len(s.tgt)} target pieces (kinds: {', '.join(SHARE_KINDS)})")
            shares[kind] = [round(min(max(float(v), 0.0), 1.0), 4) for v in values]
        entries.append({
            **sides, "number": int(s.number), "maps": maps, "shares": shares,
            "words": words,
            "links": _links(s.links), "sure": _links(s.sure), "possible": _links(possible), "aer": aer,
        })
    return entries, b"".join(chunks)


def script_json(value) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` (so no ``</script>`` or
    ``<!--``), written as JSON escapes that ``JSON.parse`` reads back."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


@dataclass(frozen=True)
class Packed:
    """What the page reads: ``data`` (JSON: labels, words, links, where each map's weights start), the
    quantised weights deflated and in base64 (``weights``), and their size inflated (``bytes``).
    ``attnmt serve``'s ``/attention`` answers with the same three fields."""

    data: dict
    weights: str
    bytes: int


def pack(sentences: Sequence[ExplorerSentence], level: int = 9) -> Packed:
    """The explorer's data for ``sentences`` (zlib ``level``: 9 for a page written once, lower to serve)."""
    entries, weights = _payload(sentences)
    data = {"kinds": KIND_NAMES, "axes": KIND_AXES, "levels": LEVELS, "sentences": entries}
    return Packed(data, base64.b64encode(zlib.compress(weights, level)).decode("ascii"), len(weights))


def explorer_html(sentences: Sequence[ExplorerSentence], title: str = "attnmt attention") -> str:
    """The page for ``sentences``, as one HTML string (see the module docstring for what it shows)."""
    packed = pack(sentences)
    heading = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<title>{heading}</title>\n<style>{_STYLE}</style>\n</head>\n<body data-draws=\"0\">\n"
        f"<h1>{heading}</h1>\n{_BODY}"
        f"<script id=\"explorer-data\" type=\"application/json\">{script_json(packed.data)}</script>\n"
        f"<script id=\"explorer-weights\" type=\"application/octet-stream\" data-bytes=\"{packed.bytes}\">"
        f"{packed.weights}</script>\n"
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_explorer(path: Path, sentences: Sequence[ExplorerSentence], title: str = "attnmt attention") -> int:
    """Write ``explorer_html(sentences, title)`` to ``path`` atomically; returns the bytes written."""
    data = explorer_html(sentences, title).encode("utf-8")
    atomic_write_bytes(Path(path), data)
    return len(data)


# ------------------------------------------------------------------------------------------ the page
# The page's style, controls and script are package files beside this module (``web/``).

_PAGE = resources.files("attnmt") / "web"
_STYLE = (_PAGE / "explorer.css").read_text(encoding="utf-8")
_BODY = (_PAGE / "explorer_body.html").read_text(encoding="utf-8")
_SCRIPT = (_PAGE / "explorer.js").read_text(encoding="utf-8")

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
- ``#explorer-tooltip``: what the pointer is over, e.g. ``Fahrrad → bicycle: 0.734`` (key → query, 3
  decimals) for a cell or line, or a token's weights for a label;
- heatmap: ``#explorer-heatmap`` with ``data-rows``, ``data-cols``; ``.col-label`` (``data-col``),
  ``.row-label`` (``data-row``), ``.cell`` (``data-row``, ``data-col``, ``data-w``: the drawn weight, 6
  decimals);
- lines: ``#explorer-lines`` with ``data-rows``, ``data-cols``; ``.line-key`` (``data-col``),
  ``.line-query`` (``data-row``), ``.attn-line`` (``data-row``, ``data-col``, ``data-w``), ``.align-line``;
- alignment classes on ``.cell`` and ``.align-line``: ``link`` and one of ``link-sure``,
  ``link-possible``, ``link-false``, ``link-missed`` (with gold) or ``link-predicted`` (without);
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
from pathlib import Path

import numpy as np

from .runfiles import atomic_write_bytes
from .words import membership_of, piece_words

KINDS = ("cross", "enc_self", "dec_self")
KIND_NAMES = {"cross": "cross-attention", "enc_self": "encoder self-attention",
              "dec_self": "decoder self-attention"}
# Which piece sequence labels the rows (queries) and the columns (keys) of each kind.
KIND_AXES = {"cross": ("tgt", "src"), "enc_self": ("src", "src"), "dec_self": ("tgt_in", "tgt_in")}
LEVELS = 255  # uint8 quantisation: w -> round(w * LEVELS)


@dataclass
class ExplorerSentence:
    """One sentence's attention for the page. ``maps[kind]`` holds one (H, rows, cols) array per layer:
    ``cross`` (always present) is (H, len(tgt), len(src)), ``enc_self`` (H, len(src), len(src)) and
    ``dec_self`` (H, len(tgt_in), len(tgt_in)). Links are (source word, target word) in the word indices of
    ``piece_words(src)`` and ``piece_words(tgt)``, or of ``src_words`` / ``tgt_words`` when given: (a
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
        entries.append({
            **sides, "number": int(s.number), "maps": maps,
            "words": words,
            "links": _links(s.links), "sure": _links(s.sure), "possible": _links(possible), "aer": aer,
        })
    return entries, b"".join(chunks)


def script_json(value) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` (so no ``</script>`` or
    ``<!--``), written as JSON escapes that ``JSON.parse`` reads back."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def explorer_html(sentences: Sequence[ExplorerSentence], title: str = "attnmt attention") -> str:
    """The page for ``sentences``, as one HTML string (see the module docstring for what it shows)."""
    entries, weights = _payload(sentences)
    data = {"kinds": KIND_NAMES, "axes": KIND_AXES, "levels": LEVELS, "sentences": entries}
    packed = base64.b64encode(zlib.compress(weights, 9)).decode("ascii")
    heading = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<title>{heading}</title>\n<style>{_STYLE}</style>\n</head>\n<body data-draws=\"0\">\n"
        f"<h1>{heading}</h1>\n{_BODY}"
        f"<script id=\"explorer-data\" type=\"application/json\">{script_json(data)}</script>\n"
        f"<script id=\"explorer-weights\" type=\"application/octet-stream\" data-bytes=\"{len(weights)}\">"
        f"{packed}</script>\n"
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_explorer(path: Path, sentences: Sequence[ExplorerSentence], title: str = "attnmt attention") -> int:
    """Write ``explorer_html(sentences, title)`` to ``path`` atomically; returns the bytes written."""
    data = explorer_html(sentences, title).encode("utf-8")
    atomic_write_bytes(Path(path), data)
    return len(data)


# ------------------------------------------------------------------------------------------ the page

_STYLE = """
:root { --cell: 22px; --pitch: 22px; --sure: #00c853; --false: #ff1744; --missed: #ff9100;
  font-family: system-ui, "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Noto Sans Arabic",
    "Noto Sans Hebrew", sans-serif; font-size: 14px; color: #1b1b1b; background: #fff; }
body { margin: 12px 16px; }
h1 { font-size: 17px; margin: 0 0 8px; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; margin-bottom: 8px; }
.controls label { display: inline-flex; gap: 4px; align-items: center; }
#explorer-sentence { max-width: 46em; }
.sentence { margin: 6px 0; line-height: 1.5; }
.sentence .side { color: #666; display: inline-block; width: 4.5em; }
#explorer-number { font-weight: 600; margin-right: 8px; }
#explorer-aer { font-weight: 600; margin-left: 10px; }
#explorer-tooltip { min-height: 1.5em; padding: 3px 8px; margin: 6px 0; background: #f3f3f3;
  border-radius: 4px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#explorer-axes { color: #555; margin: 4px 0; }
.bar { display: inline-block; width: 120px; height: 10px; vertical-align: middle; margin: 0 4px;
  background: linear-gradient(to right, #440154, #472d7b, #3b528b, #2c728e, #21918c, #28ae80, #5ec962,
    #addc30, #fde725); }
#explorer-legend { margin: 4px 0; display: flex; gap: 14px; flex-wrap: wrap; align-items: center; }
#explorer-legend[hidden] { display: none; }
.legend-item { display: inline-flex; gap: 5px; align-items: center; }
.swatch { display: inline-block; width: var(--cell); height: var(--cell); background: #3b528b; }
.heatmap { display: grid; gap: 1px; width: max-content; margin-top: 6px; }
.cell { width: var(--cell); height: var(--cell); box-sizing: border-box; }
.row-label, .col-label, .line-key, .line-query { white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; cursor: default; }
.row-label { text-align: right; padding-right: 6px; max-width: 16em; line-height: var(--cell); }
.col-label { writing-mode: vertical-rl; text-orientation: sideways; transform: rotate(180deg);
  text-align: left; max-height: 11em; justify-self: center; align-self: end; line-height: var(--cell);
  padding-top: 4px; }
.row-label.hl, .col-label.hl, .line-key.hl, .line-query.hl { background: #ffe08a; }
.heatmap.focus .cell:not(.hl) { opacity: 0.3; }
.cell:hover { outline: 2px solid #000; outline-offset: 0; position: relative; z-index: 2; }
.cell.link, .swatch.link { outline-width: 3px; outline-offset: -3px; box-shadow: inset 0 0 0 4px #000; }
:is(.cell, .swatch).link-predicted { outline-style: solid; outline-color: #fff; }
:is(.cell, .swatch).link-sure { outline-style: solid; outline-color: var(--sure); }
:is(.cell, .swatch).link-possible { outline-style: dashed; outline-color: var(--sure); }
:is(.cell, .swatch).link-false { outline-style: solid; outline-color: var(--false); }
:is(.cell, .swatch).link-missed { outline-style: dotted; outline-color: var(--missed); }
.lines { display: grid; grid-template-columns: max-content 260px max-content; margin-top: 6px; }
.line-key, .line-query { height: var(--pitch); line-height: var(--pitch); max-width: 16em; padding: 0 6px; }
.line-key { text-align: right; }
.line-query { text-align: left; }
.attn-line { stroke: #1f4e9c; stroke-width: 2; }
.lines.focus .attn-line:not(.hl) { stroke-opacity: 0.04; }
.attn-line.hl { stroke: #d81b60; }
.align-line { stroke-width: 3; fill: none; pointer-events: none; }
line.link-predicted { stroke: #000; }
line.link-sure { stroke: var(--sure); }
line.link-possible { stroke: var(--sure); stroke-dasharray: 7 4; }
line.link-false { stroke: var(--false); }
line.link-missed { stroke: var(--missed); stroke-dasharray: 2 3; }
"""

_BODY = """<div class="controls">
<button id="explorer-prev" type="button" title="previous sentence (left arrow)">&#9664;</button>
<select id="explorer-sentence" aria-label="sentence"></select>
<button id="explorer-next" type="button" title="next sentence (right arrow)">&#9654;</button>
<label>attention <select id="explorer-kind"></select></label>
<label>layer <select id="explorer-layer"></select></label>
<label>head <select id="explorer-head"></select></label>
<label>view <select id="explorer-view"><option value="heatmap">heatmap</option>
<option value="lines">lines</option></select></label>
<label>units <select id="explorer-units"><option value="pieces">pieces</option>
<option value="words">words</option></select></label>
</div>
<div class="sentence"><span id="explorer-number"></span><span id="explorer-aer"></span><br>
<span class="side">source</span><span id="explorer-src" dir="auto"></span><br>
<span class="side">target</span><span id="explorer-tgt" dir="auto"></span></div>
<div id="explorer-axes"></div>
<div>0<span class="bar"></span>1</div>
<div id="explorer-legend" hidden></div>
<div id="explorer-tooltip" aria-live="polite"></div>
<div id="explorer-view-area"></div>
"""

_SCRIPT = r"""
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const DATA = JSON.parse($("explorer-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";  // the SVG namespace (a name, never loaded)
  const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
                   [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]];
  const LINE_MIN = 0.002;  // lines for weights below this are not drawn
  const PITCH = 22;
  const LINK_NAMES = {"link-sure": "sure, predicted", "link-possible": "possible, predicted",
                      "link-false": "predicted, not in gold", "link-missed": "sure, missed",
                      "link-predicted": "predicted link"};
  const state = {sentence: 0, kind: "cross", layer: null, head: "avg", view: "heatmap", units: "pieces"};
  let WEIGHTS = null;
  let drawn = null;  // what is on screen: {mat, rowLabels, colLabels, marks}
  window.explorerDraws = 0;

  function colour(w) {
    const x = Math.min(Math.max(w, 0), 1) * (VIRIDIS.length - 1);
    const k = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - k;
    const a = VIRIDIS[k], b = VIRIDIS[k + 1];
    return "rgb(" + [0, 1, 2].map((c) => Math.round(a[c] + f * (b[c] - a[c]))).join(",") + ")";
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function inflate() {
    const packed = $("explorer-weights");
    const binary = atob(packed.textContent.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    const out = new Uint8Array(await new Response(stream).arrayBuffer());
    if (out.length !== Number(packed.dataset.bytes)) throw new Error("the embedded weights are damaged");
    return out;
  }

  // Each piece's words with their share: [[word, share], ...] (the page stores a whole word as its index).
  for (const s of DATA.sentences) {
    for (const side of Object.values(s.words)) {
      side.members = side.members.map((m) => (typeof m === "number" ? [[m, 1]] : m));
    }
  }

  function text(pieces) {
    return pieces.filter((p) => p !== "<s>" && p !== "</s>" && p !== "<pad>").join("")
      .replace(/\u2581/g, " ").trim();
  }

  // The (rows, cols) weights of one layer: one head, or the mean of the heads ("avg").
  function pieceMatrix(map, layer, head) {
    const n = map.rows * map.cols, base = map.offset + layer * map.heads * n;
    const w = new Float64Array(n);
    if (head === "avg") {
      for (let h = 0; h < map.heads; h++) {
        const start = base + h * n;
        for (let k = 0; k < n; k++) w[k] += WEIGHTS[start + k];
      }
      const scale = DATA.levels * map.heads;
      for (let k = 0; k < n; k++) w[k] /= scale;
    } else {
      const start = base + head * n;
      for (let k = 0; k < n; k++) w[k] = WEIGHTS[start + k] / DATA.levels;
    }
    return {rows: map.rows, cols: map.cols, w: w};
  }

  // words.merge: (Mr^T W Mc) / colsum(Mr), key pieces summed with their share, query pieces averaged.
  function mergeWords(mat, rowWords, colWords) {
    const R = rowWords.labels.length, C = colWords.labels.length;
    const summed = new Float64Array(mat.rows * C);  // W Mc: (T, C)
    for (let i = 0; i < mat.rows; i++) {
      for (let j = 0; j < mat.cols; j++) {
        const v = mat.w[i * mat.cols + j];
        if (v === 0) continue;
        for (const [b, share] of colWords.members[j]) summed[i * C + b] += v * share;
      }
    }
    const w = new Float64Array(R * C), total = new Float64Array(R);
    for (let i = 0; i < mat.rows; i++) {
      for (const [a, share] of rowWords.members[i]) {
        total[a] += share;
        for (let b = 0; b < C; b++) w[a * C + b] += share * summed[i * C + b];
      }
    }
    for (let a = 0; a < R; a++) {
      const d = total[a] > 0 ? total[a] : 1;
      for (let b = 0; b < C; b++) w[a * C + b] /= d;
    }
    return {rows: R, cols: C, w: w};
  }

  // Alignment classes by "row,col" (target word, source word), for the word view of cross-attention.
  function alignmentMarks(s) {
    const marks = new Map();
    if (!s.links) return marks;
    const key = (pair) => pair[1] + "," + pair[0];
    const gold = s.sure !== null || s.possible !== null;
    const sure = new Set((s.sure || []).map(key)), possible = new Set((s.possible || []).map(key));
    for (const link of s.links) {
      const k = key(link);
      marks.set(k, !gold ? "link-predicted" : sure.has(k) ? "link-sure"
        : possible.has(k) ? "link-possible" : "link-false");
    }
    for (const k of sure) if (!marks.has(k)) marks.set(k, "link-missed");
    return marks;
  }

  function current() {
    const s = DATA.sentences[state.sentence];
    const map = s.maps[state.kind];
    const layer = state.layer === null ? map.layers - 1 : Math.min(state.layer, map.layers - 1);
    const head = state.head === "avg" || Number(state.head) >= map.heads ? "avg" : Number(state.head);
    const [rowSide, colSide] = DATA.axes[state.kind];
    let mat = pieceMatrix(map, layer, head), rowLabels = s[rowSide], colLabels = s[colSide];
    let marks = new Map();
    if (state.units === "words") {
      mat = mergeWords(mat, s.words[rowSide], s.words[colSide]);
      rowLabels = s.words[rowSide].labels;
      colLabels = s.words[colSide].labels;
      if (state.kind === "cross") marks = alignmentMarks(s);
    }
    return {s: s, mat: mat, rowLabels: rowLabels, colLabels: colLabels, marks: marks,
            rowSide: rowSide, colSide: colSide, layer: layer, head: head};
  }

  function options(select, items, value) {
    select.replaceChildren(...items.map(([v, label]) => {
      const option = el("option", null, label);
      option.value = v;
      return option;
    }));
    select.value = value;
  }

  // The sentence's kinds, layers and heads as choices, keeping the current choice where it still exists.
  function refreshChoices() {
    const s = DATA.sentences[state.sentence];
    const kinds = Object.keys(s.maps);
    if (!kinds.includes(state.kind)) state.kind = kinds[0];
    options($("explorer-kind"), kinds.map((k) => [k, DATA.kinds[k]]), state.kind);
    const map = s.maps[state.kind];
    const layer = state.layer === null ? map.layers - 1 : Math.min(state.layer, map.layers - 1);
    options($("explorer-layer"), [...Array(map.layers).keys()].map((l) => [String(l), String(l + 1)]),
            String(layer));
    if (state.head !== "avg" && Number(state.head) >= map.heads) state.head = "avg";
    options($("explorer-head"), [["avg", "avg"], ...[...Array(map.heads).keys()].map((h) => [String(h),
            String(h + 1)])], state.head);
  }

  function showSentence() {
    const s = DATA.sentences[state.sentence];
    $("explorer-sentence").value = String(state.sentence);
    $("explorer-number").textContent = "sentence " + s.number;
    $("explorer-src").textContent = text(s.src);
    $("explorer-tgt").textContent = text(s.tgt);
    $("explorer-aer").textContent = s.aer === null ? "" : "AER " + s.aer.toFixed(3);
  }

  function label(tag, cls, textValue, attr, index) {
    const node = el(tag, cls, textValue);
    node.dir = "auto";
    node.title = textValue;
    node.dataset[attr] = String(index);
    return node;
  }

  function viewBox(cls, id, mat) {
    const box = el("div", cls);
    box.id = id;
    box.dataset.rows = String(mat.rows);
    box.dataset.cols = String(mat.cols);
    return box;
  }

  function drawHeatmap(view, area) {
    const {mat, rowLabels, colLabels, marks} = view;
    const grid = viewBox("heatmap", "explorer-heatmap", mat);
    grid.style.gridTemplateColumns = "max-content repeat(" + mat.cols + ", var(--cell))";
    const parts = document.createDocumentFragment();
    parts.appendChild(el("div", "corner"));
    colLabels.forEach((t, j) => parts.appendChild(label("div", "col-label", t, "col", j)));
    for (let i = 0; i < mat.rows; i++) {
      parts.appendChild(label("div", "row-label", rowLabels[i], "row", i));
      for (let j = 0; j < mat.cols; j++) {
        const w = mat.w[i * mat.cols + j];
        const cell = el("div", "cell");
        cell.dataset.row = String(i);
        cell.dataset.col = String(j);
        cell.dataset.w = w.toFixed(6);
        cell.style.backgroundColor = colour(w);
        const mark = marks.get(i + "," + j);
        if (mark) cell.classList.add("link", mark);
        parts.appendChild(cell);
      }
    }
    grid.appendChild(parts);
    area.replaceChildren(grid);
  }

  function svgNode(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function drawLines(view, area) {
    const {mat, rowLabels, colLabels, marks} = view;
    const box = viewBox("lines", "explorer-lines", mat);
    const keys = el("div", "line-column"), queries = el("div", "line-column");
    colLabels.forEach((t, j) => keys.appendChild(label("div", "line-key", t, "col", j)));
    rowLabels.forEach((t, i) => queries.appendChild(label("div", "line-query", t, "row", i)));
    const height = Math.max(mat.rows, mat.cols) * PITCH, width = 260;
    const svg = svgNode("svg", {width: width, height: height, viewBox: "0 0 " + width + " " + height});
    const y = (k) => k * PITCH + PITCH / 2;
    for (let i = 0; i < mat.rows; i++) {
      for (let j = 0; j < mat.cols; j++) {
        const w = mat.w[i * mat.cols + j];
        if (w < LINE_MIN) continue;
        const line = svgNode("line", {class: "attn-line", x1: 0, y1: y(j), x2: width, y2: y(i),
                                      "stroke-opacity": w.toFixed(4)});
        line.dataset.row = String(i);
        line.dataset.col = String(j);
        line.dataset.w = w.toFixed(6);
        svg.appendChild(line);
      }
    }
    for (const [k, mark] of marks) {
      const [i, j] = k.split(",").map(Number);
      const line = svgNode("line", {class: "align-line link " + mark, x1: 0, y1: y(j), x2: width, y2: y(i)});
      line.dataset.row = String(i);
      line.dataset.col = String(j);
      svg.appendChild(line);
    }
    box.append(keys, svg, queries);
    area.replaceChildren(box);
  }

  function drawLegend(marks) {
    const legend = $("explorer-legend");
    const counts = new Map();
    for (const mark of marks.values()) counts.set(mark, (counts.get(mark) || 0) + 1);
    const order = ["link-sure", "link-possible", "link-false", "link-missed", "link-predicted"];
    const s = DATA.sentences[state.sentence];
    const gold = s.sure !== null || s.possible !== null;
    const shown = order.filter((c) => (gold ? c !== "link-predicted" : c === "link-predicted"));
    legend.hidden = !(state.units === "words" && state.kind === "cross" && s.links);
    legend.replaceChildren(...shown.map((c) => {
      const item = el("span", "legend-item");
      item.dataset.class = c;
      item.dataset.count = String(counts.get(c) || 0);
      let swatch;
      if (state.view === "lines") {
        swatch = svgNode("svg", {width: 30, height: 10});
        swatch.appendChild(svgNode("line", {class: "align-line link " + c, x1: 0, y1: 5, x2: 30, y2: 5}));
      } else {
        swatch = el("span", "swatch link " + c);
      }
      item.append(swatch, el("span", null, LINK_NAMES[c] + " (" + (counts.get(c) || 0) + ")"));
      return item;
    }));
  }

  function draw() {
    const view = current();
    drawn = view;
    const area = $("explorer-view-area");
    if (state.view === "lines") drawLines(view, area); else drawHeatmap(view, area);
    const names = {src: "source", tgt: "target", tgt_in: "target input"};
    const unit = state.units === "words" ? "words" : "pieces";
    const count = view.s.maps[state.kind].heads;
    const heads = view.head !== "avg" ? "head " + (view.head + 1)
      : count === 1 ? "1 head" : "average of " + count + " heads";
    const lines = state.view === "lines";
    $("explorer-axes").textContent = DATA.kinds[state.kind] + ", layer " + (view.layer + 1) + ", " + heads
      + ": " + (lines ? "keys (left): " : "columns (keys): ") + names[view.colSide] + " " + unit
      + "; " + (lines ? "queries (right): " : "rows (queries): ") + names[view.rowSide] + " " + unit;
    drawLegend(view.marks);
    $("explorer-tooltip").textContent = "";
    window.explorerDraws += 1;
    document.body.dataset.draws = String(window.explorerDraws);
    if (window.explorerReady === undefined) window.explorerReady = performance.now();
  }

  // ------------------------------------------------------------------ hovering

  const tip = (t) => { $("explorer-tooltip").textContent = t; };
  const fmt = (w) => w.toFixed(3);

  function pairText(i, j) {
    const w = drawn.mat.w[i * drawn.mat.cols + j];
    const mark = drawn.marks.get(i + "," + j);
    return drawn.colLabels[j] + " \u2192 " + drawn.rowLabels[i] + ": " + fmt(w)
      + (mark ? " (" + LINK_NAMES[mark] + ")" : "");
  }

  // A token's weights, largest first: a query's over the keys, or what each query gives a key.
  function tokenText(axis, index) {
    const {mat, rowLabels, colLabels} = drawn;
    const pairs = [];
    if (axis === "row") {
      for (let j = 0; j < mat.cols; j++) pairs.push([colLabels[j], mat.w[index * mat.cols + j]]);
    } else {
      for (let i = 0; i < mat.rows; i++) pairs.push([rowLabels[i], mat.w[i * mat.cols + index]]);
    }
    pairs.sort((a, b) => b[1] - a[1]);
    const top = pairs.slice(0, 10).map(([t, w]) => t + " " + fmt(w)).join(", ");
    return (axis === "row" ? rowLabels[index] + " \u2190 " : colLabels[index] + " \u2192 ") + top
      + (pairs.length > 10 ? ", \u2026" : "");
  }

  function clearFocus() {
    for (const node of document.querySelectorAll(".hl")) node.classList.remove("hl");
    for (const node of document.querySelectorAll(".focus")) node.classList.remove("focus");
  }

  function focus(area, axis, index) {
    clearFocus();
    const container = area.firstElementChild;
    container.classList.add("focus");
    const attr = axis === "row" ? "data-row" : "data-col";
    for (const node of container.querySelectorAll("[" + attr + '="' + index + '"]')) {
      if (!node.classList.contains("align-line")) node.classList.add("hl");
    }
  }

  function hover(event) {
    const area = $("explorer-view-area");
    const target = event.target.closest ? event.target.closest("[data-row], [data-col]") : null;
    if (!target || !drawn) return;
    const row = target.dataset.row, col = target.dataset.col;
    if (row !== undefined && col !== undefined) {
      tip(pairText(Number(row), Number(col)));
    } else if (row !== undefined) {
      focus(area, "row", row);
      tip(tokenText("row", Number(row)));
    } else {
      focus(area, "col", col);
      tip(tokenText("col", Number(col)));
    }
  }

  // ------------------------------------------------------------------ controls

  function go(index) {
    const n = DATA.sentences.length;
    state.sentence = ((index % n) + n) % n;
    refreshChoices();
    showSentence();
    draw();
  }

  function start() {
    const select = $("explorer-sentence");
    select.replaceChildren(...DATA.sentences.map((s, k) => {
      const aer = s.aer === null ? "" : "  (AER " + s.aer.toFixed(3) + ")";
      const cut = (t) => (t.length > 60 ? t.slice(0, 59) + "\u2026" : t);
      const caption = s.number + ": " + cut(text(s.src)) + " \u2192 " + cut(text(s.tgt)) + aer;
      const option = el("option", null, caption);
      option.value = String(k);
      return option;
    }));
    select.addEventListener("change", () => go(Number(select.value)));
    $("explorer-prev").addEventListener("click", () => go(state.sentence - 1));
    $("explorer-next").addEventListener("click", () => go(state.sentence + 1));
    $("explorer-kind").addEventListener("change", (e) => {
      state.kind = e.target.value;
      refreshChoices();
      draw();
    });
    $("explorer-layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); draw(); });
    $("explorer-head").addEventListener("change", (e) => { state.head = e.target.value; draw(); });
    $("explorer-view").addEventListener("change", (e) => { state.view = e.target.value; draw(); });
    $("explorer-units").addEventListener("change", (e) => { state.units = e.target.value; draw(); });
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT" || e.altKey || e.ctrlKey || e.metaKey) return;
      if (e.key === "ArrowLeft") go(state.sentence - 1);
      if (e.key === "ArrowRight") go(state.sentence + 1);
    });
    const area = $("explorer-view-area");
    area.addEventListener("mouseover", hover);
    area.addEventListener("mouseleave", () => { clearFocus(); tip(""); });
    go(0);
  }

  inflate().then((weights) => {
    WEIGHTS = weights;
    if (DATA.sentences.length === 0) {
      tip("no sentences");
      window.explorerReady = performance.now();
      return;
    }
    start();
  }).catch((error) => {
    window.explorerError = String(error && error.message || error);
    tip("cannot show the attention: " + window.explorerError);
    console.error(error);
  });
})();
"""

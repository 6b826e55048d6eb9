"""Drawing: attention heatmaps and training curves, from arrays and strings only.

Letters: H heads, T target (query) positions, S source (key) positions.

Nothing here imports model code or torch: every function takes numpy arrays, token labels or the
files of a run, so it works on the output of an earlier run as well as inside ``attnmt train``.
Figures are ``matplotlib.figure.Figure`` objects drawn by the Agg canvas; nothing touches pyplot or
``rcParams``. Labels are drawn as plain text (``parse_math=False``: a ``$`` or ``\\`` in a piece is
never mathtext); a label with characters the default font lacks is drawn in a CJK font when one is
installed (the ``noto-cjk-sans-otc`` package, else a system font), otherwise with missing-glyph boxes,
and matplotlib's "Glyph missing" warnings are silenced while drawing.

Figures are written through ``runfiles.atomic_write_bytes``, so a folder of plots only ever holds
complete files. Merging pieces into words is ``words.merge_words``.
"""

from __future__ import annotations

import functools
import io
import math
import os
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.transforms import offset_copy

from ..data.words import merge_words
from ..runfiles import atomic_write_bytes

FORMATS = ("png", "svg", "pdf")

# Sizes in inches (points for fonts): a cell per token, a cap on the whole figure.
CELL = 0.2
MIN_PANEL = 1.0
MAX_FIGURE = 20.0
FONT_SIZE = 8.0
MIN_FONT_SIZE = 3.0
MAX_LABEL_CHARS = 24
X_ROTATION = 60
CMAP = "viridis"


# ------------------------------------------------------------------------------------------- fonts


@functools.lru_cache(maxsize=1)
def _default_charmap() -> frozenset[int]:
    """Code points of the font matplotlib draws plain text with (DejaVu Sans unless configured)."""
    from matplotlib.font_manager import findfont, get_font

    try:
        return frozenset(get_font(findfont(FontProperties())).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset(range(128))


@functools.lru_cache(maxsize=1)
def cjk_font_path() -> str | None:
    """A font file with CJK glyphs: the ``noto-cjk-sans-otc`` package's, else an installed system font
    (Noto/Source Han CJK, WenQuanYi, Droid Sans Fallback, ...); None when there is none."""
    import importlib.util

    candidates: list[str] = []
    spec = importlib.util.find_spec("noto_cjk_sans_otc")  # located, not imported
    if spec is not None and spec.submodule_search_locations:
        candidates += [str(Path(p) / "NotoSansCJK-Regular.ttc") for p in spec.submodule_search_locations]
    from matplotlib.font_manager import findSystemFonts

    hints = ("cjk", "wqy", "wenquanyi", "droidsansfallback", "sourcehan", "notosanssc", "notosansjp", "ukai",
             "uming")
    candidates += sorted(p for p in findSystemFonts()
                         if any(h in Path(p).name.lower().replace("-", "") for h in hints))
    for path in candidates:
        if _has_glyph(path, "中"):
            return path
    return None


def _has_glyph(path: str, char: str) -> bool:
    from matplotlib.font_manager import get_font

    try:
        return os.path.isfile(path) and ord(char) in get_font(path).get_charmap()
    except (OSError, RuntimeError, ValueError):
        return False


def _font_for(label: str, size: float) -> FontProperties:
    """The default font, or the CJK font for a label the default font cannot draw (when one is installed)."""
    default = _default_charmap()
    needs_other = not all(ord(c) in default for c in label)
    return _font(cjk_font_path() if needs_other else None, size)


@functools.lru_cache(maxsize=64)
def _font(path: str | None, size: float) -> FontProperties:
    return FontProperties(fname=path, size=size) if path else FontProperties(size=size)


def _label_units(label: str) -> float:
    """Width of a label in ems (roughly): wide East Asian characters take one em, others 0.62."""
    return sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.62 for c in label)


def shorten(label: str, limit: int = MAX_LABEL_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------- heatmaps


@dataclass(frozen=True)
class Layout:
    """Where the panels of one figure go (inches)."""

    width: float
    height: float
    rows: int
    cols: int
    panel_w: float
    panel_h: float
    left: float
    bottom: float
    wgap: float
    hgap: float
    font_size: float


def layout(n_panels: int, n_rows: int, n_cols: int, row_labels: Sequence[str],
           col_labels: Sequence[str]) -> Layout:
    """A figure size that grows with the sentence (``CELL`` inches per token) up to ``MAX_FIGURE``
    inches a side; beyond that the cells and the font shrink."""
    cols = n_panels if n_panels <= 3 else math.ceil(math.sqrt(n_panels))
    rows = math.ceil(n_panels / cols)
    font = FONT_SIZE
    panel_w, panel_h = max(n_cols * CELL, MIN_PANEL), max(n_rows * CELL, MIN_PANEL)
    for _ in range(2):
        em = font / 72
        y_text = max((_label_units(s) for s in row_labels), default=1) * em
        x_text = max((_label_units(s) for s in col_labels), default=1) * em
        left = y_text + 0.45  # tick labels, the axis title
        bottom = x_text * math.sin(math.radians(X_ROTATION)) + em + 0.45
        top, right = 0.55, 0.9  # the title and panel titles; the colour bar
        wgap, hgap = 0.15, 0.3
        fixed_w = left + right + (cols - 1) * wgap
        fixed_h = bottom + top + (rows - 1) * hgap
        scale = min(1.0, (MAX_FIGURE - fixed_w) / (cols * panel_w), (MAX_FIGURE - fixed_h) / (rows * panel_h))
        if scale >= 1.0:
            break
        scale = max(scale, 0.05)
        panel_w, panel_h = panel_w * scale, panel_h * scale
        cell = min(panel_w / max(n_cols, 1), panel_h / max(n_rows, 1))
        font = max(MIN_FONT_SIZE, min(FONT_SIZE, cell * 72 * 0.85))
    width = fixed_w + cols * panel_w
    height = fixed_h + rows * panel_h
    return Layout(width, height, rows, cols, panel_w, panel_h, left, bottom, wgap, hgap, font)


class HeatmapFigure:
    """One Figure for many heatmaps: when the next heatmap has as many panels as the last, its axes,
    images, colour bar and tick objects are reused and only data, labels and sizes change (most of
    matplotlib's time goes into creating those objects, not into drawing)."""

    def __init__(self) -> None:
        self.fig = Figure()
        FigureCanvasAgg(self.fig)
        self._panels = -1
        self._axes: list = []
        self._images: list = []
        self._headings: list = []
        self._cax = self._title = self._xlabel = self._ylabel = None

    def draw(
        self,
        panels: np.ndarray,
        col_labels: Sequence[str],
        row_labels: Sequence[str],
        panel_titles: Sequence[str | None] | None = None,
        title: str | None = None,
        xlabel: str = "source",
        ylabel: str = "target",
    ) -> Figure:
        """Heatmaps of attention weights: ``panels`` (T, S) or (P, T, S), e.g. the heads of a layer and
        their average; rows are queries (``row_labels``, T), columns keys (``col_labels``, S).

        Weights are drawn as they are on a fixed 0..1 scale (rows of attention already sum to 1; nothing
        is renormalised), with one colour bar. Panels share their axes: the left column carries the row
        labels, the bottom row the column labels."""
        weights = np.asarray(panels, dtype=np.float32)
        if weights.ndim == 2:
            weights = weights[None]
        if weights.ndim != 3:
            raise ValueError(f"attention must be (T, S) or (panels, T, S), got shape {weights.shape}")
        n, T, S = weights.shape
        if len(row_labels) != T or len(col_labels) != S:
            raise ValueError(f"attention is {T} x {S} but there are {len(row_labels)} row and "
                             f"{len(col_labels)} column labels")
        titles = list(panel_titles) if panel_titles is not None else [None] * n
        rows_text, cols_text = [shorten(s) for s in row_labels], [shorten(s) for s in col_labels]
        lay = layout(n, T, S, rows_text, cols_text)
        fig = self.fig
        if n != self._panels:
            self._build(n, weights)
        fig.set_size_inches(lay.width, lay.height)
        W, H = lay.width, lay.height
        for k, (ax, image, heading) in enumerate(zip(self._axes, self._images, self._headings)):
            r, c = divmod(k, lay.cols)
            x0 = lay.left + c * (lay.panel_w + lay.wgap)
            y0 = lay.bottom + (lay.rows - 1 - r) * (lay.panel_h + lay.hgap)
            ax.set_position((x0 / W, y0 / H, lay.panel_w / W, lay.panel_h / H))
            image.set_data(weights[k])
            image.set_extent((-0.5, S - 0.5, T - 0.5, -0.5))
            ax.set_xlim(-0.5, S - 0.5)
            ax.set_ylim(T - 0.5, -0.5)
            _ticks(ax, "x", S, cols_text if k + lay.cols >= n else None, lay.font_size)
            _ticks(ax, "y", T, rows_text if c == 0 else None, lay.font_size)
            heading.set_text(titles[k] or "")
        grid_w = lay.cols * lay.panel_w + (lay.cols - 1) * lay.wgap
        grid_h = lay.rows * lay.panel_h + (lay.rows - 1) * lay.hgap
        self._cax.set_position(((W - 0.75) / W, lay.bottom / H, 0.15 / W, grid_h / H))
        # Axis titles as figure text at fixed places: matplotlib's own would measure every tick label.
        self._xlabel.set_text(xlabel)
        self._xlabel.set_position(((lay.left + grid_w / 2) / W, 0.08 / H))
        self._ylabel.set_text(ylabel)
        self._ylabel.set_position((0.08 / W, (lay.bottom + grid_h / 2) / H))
        self._title.set_text(title or "")
        self._title.set_y(1 - 0.12 / H)
        return fig

    def _build(self, n: int, weights: np.ndarray) -> None:
        fig = self.fig
        fig.clear()
        self._axes, self._images, self._headings = [], [], []
        for k in range(n):
            ax = fig.add_axes((0, 0, 1, 1))
            for axis in (ax.xaxis, ax.yaxis):
                # fixed: never measure the tick labels to place an (empty) axis title
                axis.set_label_coords(0, 0)
            # Labels without tick marks: each label sits at the centre of its row or column.
            ax.tick_params(bottom=False, left=False, pad=1.5)
            self._axes.append(ax)
            self._images.append(ax.imshow(weights[k], cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto",
                                          interpolation="nearest"))
            above = offset_copy(ax.transAxes, fig=fig, y=2, units="points")
            self._headings.append(ax.text(0.5, 1.0, "", transform=above, ha="center", va="bottom",
                                          fontsize=FONT_SIZE, parse_math=False))
        self._cax = fig.add_axes((0, 0, 1, 1))
        fig.colorbar(self._images[0], cax=self._cax).ax.tick_params(labelsize=FONT_SIZE - 1)
        self._title = fig.text(0.5, 1.0, "", ha="center", va="top", fontsize=FONT_SIZE + 1, parse_math=False)
        self._xlabel = fig.text(0.5, 0.0, "", ha="center", va="bottom", fontsize=FONT_SIZE + 1,
                                parse_math=False)
        self._ylabel = fig.text(0.0, 0.5, "", ha="left", va="center", rotation=90, fontsize=FONT_SIZE + 1,
                                parse_math=False)
        self._panels = n


def attention_figure(
    panels: np.ndarray,
    col_labels: Sequence[str],
    row_labels: Sequence[str],
    panel_titles: Sequence[str | None] | None = None,
    title: str | None = None,
    xlabel: str = "source",
    ylabel: str = "target",
) -> Figure:
    """A new figure of ``HeatmapFigure.draw``: rows are ``row_labels`` (T), columns ``col_labels`` (S)."""
    return HeatmapFigure().draw(panels, col_labels, row_labels, panel_titles, title, xlabel, ylabel)


def _ticks(ax, axis: str, n: int, labels: Sequence[str] | None, size: float) -> None:
    """One tick per token with plain-text labels (no mathtext), in a CJK font where needed, x rotated;
    no ticks at all on an inner panel."""
    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    if labels is None:
        set_ticks([])
        return
    options = {"rotation": X_ROTATION, "ha": "right", "rotation_mode": "anchor"} if axis == "x" else {}
    set_ticks(range(n), labels, parse_math=False, fontsize=size, **options)
    for text in ax.get_xticklabels() if axis == "x" else ax.get_yticklabels():
        # Ticks are reused from figure to figure: set the font whenever it is not the plain default.
        font = _font_for(text.get_text(), size)
        if font.get_file() is not None or text.get_fontproperties().get_file() is not None:
            text.set_fontproperties(font)


def save_figure(fig: Figure, path: Path, fmt: str | None = None, dpi: int = 100) -> Path:
    """Write ``fig`` as png, svg or pdf (from the suffix when ``fmt`` is None), atomically (a temporary
    file in the same folder renamed into place)."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown figure format {fmt!r}; expected one of {', '.join(FORMATS)}")
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # A label with an emoji that no installed font has is drawn with a box: say nothing per glyph.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
        warnings.filterwarnings("ignore", message=r".*does not have a glyph for")
        # Fast zlib level for PNG: a heatmap is mostly flat colour, so files stay small anyway.
        extra = {"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {}
        fig.savefig(buffer, format=fmt, dpi=dpi, metadata=_metadata(fmt), **extra)
    atomic_write_bytes(path, buffer.getvalue(), durable=False)
    return path


def _metadata(fmt: str) -> dict:
    # No creation date: the same figure gives the same bytes.
    return {"Software": None} if fmt == "png" else {"Date": None} if fmt == "svg" else {"CreationDate": None}


# ------------------------------------------------------------------------------- the maps of a sentence


def head_panels(layer: np.ndarray, head: int | None = None) -> tuple[np.ndarray, list[str | None]]:
    """The panels for one layer's weights (H, T, S): every head and their average, or just ``head``
    (0-based); a one-head layer (the LSTM) is one panel."""
    layer = np.asarray(layer)
    if head is not None:
        return layer[head : head + 1], [f"head {head + 1}"]
    if layer.shape[0] == 1:
        return layer, [None]
    panels = np.concatenate([layer, layer.mean(0, keepdims=True)], axis=0)
    return panels, [f"head {h + 1}" for h in range(layer.shape[0])] + ["average"]


KIND_AXES = {"cross": ("source", "target"), "enc_self": ("source (keys)", "source"),
             "dec_self": ("target (keys)", "target")}
KIND_TITLES = {"cross": "cross-attention", "enc_self": "encoder self-attention",
               "dec_self": "decoder self-attention", "align": "alignment layer"}


def sentence_maps(
    out_dir: Path,
    number: int,
    attention: dict[str, list[np.ndarray]],
    labels: dict[str, tuple[Sequence[str], Sequence[str]]],
    layers: Sequence[int] | None = None,
    head: int | None = None,
    words: bool = False,
    fmt: str = "png",
    dpi: int = 100,
    title: str = "",
    painter: HeatmapFigure | None = None,
) -> list[Path]:
    """Write the heatmaps of one sentence: for each kind in ``attention`` (``cross``, ``enc_self``,
    ``dec_self``: one (H, T, S) array per layer) and each layer in ``layers`` (0-based; default all),
    ``NNNN_<kind>_layer<L>[_head<H>].<fmt>``. ``labels[kind]`` is (column labels, row labels), as pieces;
    with ``words`` the pieces are merged into words (``merge_words``). Returns the files written."""
    painter = painter or HeatmapFigure()
    written = []
    for kind, per_layer in attention.items():
        cols, rows = labels[kind]
        for layer in range(len(per_layer)) if layers is None else layers:
            panels, titles = head_panels(per_layer[layer], head)
            col_text, row_text = list(cols), list(rows)
            if words:
                panels, row_text, col_text = merge_words(panels, row_text, col_text)
            xlabel, ylabel = KIND_AXES.get(kind, ("keys", "queries"))
            heading = (f"{title}{KIND_TITLES.get(kind, kind)}, layer {layer + 1}"
                       + (f", head {head + 1}" if head is not None else ""))
            fig = painter.draw(panels, col_text, row_text, titles, heading, xlabel, ylabel)
            suffix = f"_head{head + 1}" if head is not None else ""
            written.append(save_figure(
                fig, Path(out_dir) / f"{number:04d}_{kind}_layer{layer + 1}{suffix}.{fmt}", fmt, dpi))
    return written

"""plot.py on its own: arrays and labels in, figures out; no model, no torch.

Oracles: the labels and weights that went in, the pixel size a figure of so many inches must have at a
given dpi, and matplotlib's rcParams unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import matplotlib
import numpy as np
import pytest
from PIL import Image

from attnmt.insight import plot

SRC = ["▁tues", "day", "▁,", "▁march", "▁14", "th", "</s>"]
TGT = ["▁dienstag", "▁,", "▁14", ".", "▁märz", "</s>"]
AWKWARD = ["$", "\\", "a_b", "$x^2$", "\\alpha", "😀", "中文", "日本語", "한국어", "ü"]


def weights(heads: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Attention-like weights (heads, rows, cols): every row sums to 1."""
    w = np.random.default_rng(seed).random((heads, rows, cols))
    return w / w.sum(-1, keepdims=True)


def tick_texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


def test_import_sets_no_state_and_imports_no_model_code():
    code = (
        "import sys, matplotlib\n"
        "before = dict(matplotlib.rcParams)\n"
        "import attnmt.insight.plot\n"
        "assert dict(matplotlib.rcParams) == before\n"
        "bad = [m for m in sys.modules if m == 'torch' or "
        "m.startswith(('torch.', 'attnmt.models', 'attnmt.decoding'))]\n"
        "assert not bad, bad\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_heads_grid_keeps_labels_in_order_and_weights_as_they_are():
    w = weights(3, len(TGT), len(SRC))
    w[0, 0] *= 0.5  # a row that does not sum to 1 must not be renormalised
    panels, titles = plot.head_panels(w)
    assert titles == ["head 1", "head 2", "head 3", "average"]
    fig = plot.attention_figure(panels, SRC, TGT, titles, "layer 1")
    heatmaps, colour_bar = fig.axes[:4], fig.axes[4]
    assert len(fig.axes) == 5 and colour_bar.get_ylim() == (0.0, 1.0)
    # 4 panels in a 2 x 2 grid: row labels on the left column, column labels on the bottom row.
    for k, ax in enumerate(heatmaps):
        assert tick_texts(ax.get_xticklabels()) == (SRC if k >= 2 else [])
        assert tick_texts(ax.get_yticklabels()) == (TGT if k % 2 == 0 else [])
        image = ax.get_images()[0]
        np.testing.assert_allclose(image.get_array(), panels[k], rtol=1e-6)
        assert image.get_clim() == (0.0, 1.0)
    np.testing.assert_allclose(panels[3], w.mean(0))
    assert [t.get_text() for t in fig.texts] == ["layer 1", "source", "target"]


def test_png_has_the_expected_pixel_size_and_is_not_blank(tmp_path):
    fig = plot.attention_figure(weights(1, len(TGT), len(SRC))[0], SRC, TGT)
    path = plot.save_figure(fig, tmp_path / "a.png", dpi=50)
    with Image.open(path) as image:
        assert image.size == tuple(round(x * 50) for x in fig.get_size_inches())
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    assert pixels.std() > 10  # not one flat colour
    # colour, not just grey text
    assert (pixels.reshape(-1, 3).max(1) - pixels.reshape(-1, 3).min(1)).max() > 50


def test_figure_size_grows_with_the_sentence_and_is_capped():
    def size(n: int) -> np.ndarray:
        labels = [f"▁w{i}" for i in range(n)]
        return plot.attention_figure(weights(1, n, n)[0], labels, labels).get_size_inches()

    short, longer, huge = size(5), size(30), size(400)
    assert (longer > short).all()
    assert (huge <= plot.MAX_FIGURE + 1e-6).all()


def test_awkward_labels_render_in_every_format_without_warnings_or_global_state(tmp_path):
    before = dict(matplotlib.rcParams)
    n = len(AWKWARD)
    fig = plot.attention_figure(weights(1, n, n)[0], AWKWARD, AWKWARD[::-1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fmt in plot.FORMATS:
            assert plot.save_figure(fig, tmp_path / f"awkward.{fmt}", dpi=40).stat().st_size > 0
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
    assert dict(matplotlib.rcParams) == before
    ax = fig.axes[0]
    assert tick_texts(ax.get_xticklabels()) == AWKWARD  # "$" and "\\" kept as text, not mathtext
    assert not any(t.get_parse_math() for t in ax.get_xticklabels())


def test_cjk_labels_use_a_cjk_font_when_one_is_installed():
    path = plot.cjk_font_path()
    if path is None:
        pytest.skip("no CJK font installed (pip install noto-cjk-sans-otc)")
    fig = plot.attention_figure(np.eye(2), ["中文", "abc"], ["x", "y"])
    fonts = [t.get_fontproperties().get_file() for t in fig.axes[0].get_xticklabels()]
    assert fonts == [path, None]


def test_sentence_maps_writes_one_file_per_kind_and_layer(tmp_path):
    attention = {"cross": [weights(2, 3, 4), weights(2, 3, 4, 1)],
                 "enc_self": [weights(2, 4, 4), weights(2, 4, 4, 1)]}
    labels = {"cross": (["▁a", "▁b", "c", "</s>"], ["▁x", "▁y", "</s>"]),
              "enc_self": (["▁a", "▁b", "c", "</s>"],) * 2}
    written = plot.sentence_maps(tmp_path, 7, attention, labels)
    assert sorted(p.name for p in written) == [
        "0007_cross_layer1.png", "0007_cross_layer2.png",
        "0007_enc_self_layer1.png", "0007_enc_self_layer2.png",
    ]  # fmt: skip
    written = plot.sentence_maps(tmp_path / "one", 1, attention, labels, layers=[1], head=0, words=True,
                                 fmt="svg")
    assert sorted(p.name for p in written) == [
        "0001_cross_layer2_head1.svg", "0001_enc_self_layer2_head1.svg"
    ]
    assert all(p.stat().st_size > 0 for p in written)
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically: no temporary file left

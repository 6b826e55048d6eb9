"""The attention explorer page: its embedded data read back in Python (weights within the quantisation step,
labels, word memberships against ``words.merge``), escaping and the absence of any network reference; then
the page itself in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium):
it loads from file:// with no console error and no request, and what it draws (the ``data-w`` of every
cell, the tooltip, the link classes) is checked against the input arrays, ``words.merge`` and
``alignment.alignment_scores``."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest
from helpers import severe

from attnmt.data.words import merge, piece_words
from attnmt.insight.explorer import LEVELS, ExplorerSentence, explorer_html, write_explorer
from attnmt.insight.links import alignment_scores

HALF_STEP = 0.5 / LEVELS + 1e-9  # the largest quantisation error of one weight
EOS = "</s>"

# Ein Mann fährt Fahrrad. -> a man rides a bicycle .
GERMAN = ["▁ein", "▁Mann", "▁fährt", "▁Fahr", "rad", ".", EOS]  # words: ein Mann fährt Fahrrad. </s>
ENGLISH = ["▁a", "▁man", "▁rid", "es", "▁a", "▁bi", "cycle", "▁.", EOS]  # a man rides a bicycle . </s>
CHINESE = ["▁一个", "男人", "骑", "自行车", "。", EOS]  # unsegmented: a word per character
ARABIC = ["▁رجل", "▁يركب", "▁دراجة", EOS]
HEBREW = ["▁איש", "▁רוכב", "▁על", "▁אופניים", EOS]
NASTY = ["▁</script>", "▁<b>bold", "▁&amp;", "▁\"'", "▁<!--", EOS]

# Hand-made alignment of GERMAN (source words 0..4) and ENGLISH (target words 0..6), as (source, target).
LINKS = [(0, 0), (1, 1), (2, 2), (3, 4), (3, 5)]
SURE = {(0, 0), (1, 1), (3, 4), (0, 3)}
POSSIBLE = SURE | {(2, 2)}
# The class of each heatmap cell (target word row, source word column).
EXPECTED_CLASSES = {(0, 0): "link-sure", (1, 1): "link-sure", (4, 3): "link-sure", (2, 2): "link-possible",
                    (5, 3): "link-false", (3, 0): "link-missed"}


def attention(rng: np.random.Generator, heads: int, rows: int, cols: int) -> np.ndarray:
    """(H, rows, cols) rows drawn from a Dirichlet: each sums to 1, some weights large, most small."""
    return rng.dirichlet(np.full(cols, 0.4), size=(heads, rows))


def sentence(rng, number, src, tgt, layers=2, heads=3, kinds=("cross", "enc_self", "dec_self"), **extra):
    tgt_in = ["<s>", *tgt[:-1]]
    shapes = {"cross": (len(tgt), len(src)), "enc_self": (len(src), len(src)),
              "dec_self": (len(tgt_in), len(tgt_in))}
    maps = {kind: [attention(rng, heads, *shapes[kind]) for _ in range(layers)] for kind in kinds}
    return ExplorerSentence(number, list(src), list(tgt), tgt_in, maps, **extra)


def aer_of(links, sure, possible) -> float:
    return alignment_scores([links], [sure], [possible]).aer


@pytest.fixture(scope="module")
def sentences() -> list[ExplorerSentence]:
    rng = np.random.default_rng(7)
    return [
        sentence(rng, 1, GERMAN, ENGLISH, links=LINKS, sure=SURE, possible=POSSIBLE,
                 aer=aer_of(LINKS, SURE, POSSIBLE)),
        sentence(rng, 2, ENGLISH, CHINESE, links=[(0, 0), (1, 2), (4, 7)]),
        sentence(rng, 3, CHINESE, ARABIC, layers=1, heads=1, kinds=("cross",)),  # an LSTM: cross, one head
        sentence(rng, 4, HEBREW, NASTY, layers=3, heads=4),
    ]


# ------------------------------------------------------------------------------ the page read in Python


class Scripts(HTMLParser):
    """The ``<script>`` elements of a page as a browser splits them: (attributes, text)."""

    def __init__(self):
        super().__init__()
        self.scripts: list[tuple[dict, str]] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._open = dict(attrs)
            self.scripts.append((self._open, ""))

    def handle_data(self, data):
        if self._open is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._open = None


def read_page(page: str) -> tuple[dict, np.ndarray]:
    """The page's JSON and its weights (uint8), read the way the page reads them."""
    parser = Scripts()
    parser.feed(page)
    by_id = {attrs.get("id"): text for attrs, text in parser.scripts}
    data = json.loads(by_id["explorer-data"])
    weights = np.frombuffer(zlib.decompress(base64.b64decode(by_id["explorer-weights"])), dtype=np.uint8)
    return data, weights


def stored_maps(entry: dict, weights: np.ndarray, kind: str) -> np.ndarray:
    """(L, H, rows, cols) weights of one kind of one sentence, dequantised."""
    m = entry["maps"][kind]
    n = m["layers"] * m["heads"] * m["rows"] * m["cols"]
    block = weights[m["offset"]: m["offset"] + n].astype(np.float64) / LEVELS
    return block.reshape(m["layers"], m["heads"], m["rows"], m["cols"])


def membership(side: dict) -> np.ndarray:
    """A side's (P, W) membership matrix from the page's sparse form."""
    matrix = np.zeros((len(side["members"]), len(side["labels"])))
    for p, member in enumerate(side["members"]):
        for w, share in [(member, 1.0)] if isinstance(member, int) else member:
            matrix[p, w] += share
    return matrix


def page_merge(weights: np.ndarray, rows: dict, cols: dict) -> np.ndarray:
    """The page's word merge written out: (Mr^T W Mc) / colsum(Mr)."""
    mr, mc = membership(rows), membership(cols)
    share = mr.sum(0)
    return mr.T @ weights @ mc / np.where(share > 0, share, 1)[:, None]


AXES = {"cross": ("tgt", "src"), "enc_self": ("src", "src"), "dec_self": ("tgt_in", "tgt_in")}


def test_the_weights_and_labels_round_trip(sentences):
    data, weights = read_page(explorer_html(sentences))
    assert len(data["sentences"]) == len(sentences)
    for entry, s in zip(data["sentences"], sentences):
        assert [entry[k] for k in ("number", "src", "tgt", "tgt_in")] == [s.number, s.src, s.tgt, s.tgt_in]
        assert set(entry["maps"]) == set(s.maps)
        for kind, layers in s.maps.items():
            stored = stored_maps(entry, weights, kind)
            assert stored.shape == (len(layers), *layers[0].shape)
            assert np.abs(stored - np.stack(layers)).max() <= HALF_STEP
        assert entry["links"] == (None if s.links is None else [list(link) for link in sorted(s.links)])
    gold = data["sentences"][0]
    assert {tuple(x) for x in gold["sure"]} == SURE and {tuple(x) for x in gold["possible"]} == POSSIBLE
    assert gold["aer"] == pytest.approx(sentences[0].aer)


@pytest.mark.parametrize("pieces", [ENGLISH, CHINESE], ids=["spaced", "cjk"])
def test_the_word_merge_of_the_page_is_words_merge(pieces):
    rng = np.random.default_rng(3)
    s = sentence(rng, 1, GERMAN, pieces)
    data, weights = read_page(explorer_html([s]))
    entry = data["sentences"][0]
    for kind in ("cross", "enc_self", "dec_self"):
        rows, cols = AXES[kind]
        piece_level = stored_maps(entry, weights, kind)[-1].mean(0)
        row_spec, row_labels = piece_words(entry[rows])
        col_spec, col_labels = piece_words(entry[cols])
        assert entry["words"][rows]["labels"] == row_labels and entry["words"][cols]["labels"] == col_labels
        expected = merge(piece_level, row_spec, col_spec)
        np.testing.assert_allclose(page_merge(piece_level, entry["words"][rows], entry["words"][cols]),
                                   expected, atol=1e-12)
    if pieces is CHINESE:  # a two-character piece shares itself between two words
        assert entry["words"]["tgt"]["members"][0] == [[0, 0.5], [1, 0.5]]


def test_given_words_replace_the_pieces_words():
    """A caller's words (align takes pre-segmented CJK words as given: 一个 男人 as two words, where the
    pieces alone would give characters) are the page's words, and links count in them."""
    rng = np.random.default_rng(4)
    s = sentence(rng, 1, GERMAN, CHINESE)
    # 一个 | 男人 | 骑 | 自行车 | 。 | </s>: the pieces are "▁一个" "男人" "骑" "自行车" "。" "</s>".
    s.tgt_words = (np.eye(6), ["一个", "男人", "骑", "自行车", "。", EOS])
    s.links = [(0, 0), (1, 1), (3, 3)]
    entry = read_page(explorer_html([s]))[0]["sentences"][0]
    assert entry["words"]["tgt"]["labels"] == ["一个", "男人", "骑", "自行车", "。", EOS]
    assert entry["words"]["tgt"]["members"] == [0, 1, 2, 3, 4, 5]
    assert entry["links"] == [[0, 0], [1, 1], [3, 3]]
    s.tgt_words = (np.eye(5), ["a", "b", "c", "d", "e"])
    with pytest.raises(ValueError, match="word membership of shape"):
        explorer_html([s])


def test_nothing_is_loaded_from_anywhere(sentences):
    page = explorer_html(sentences)
    urls = set(re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"'<>)]*", page, re.I))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls  # the SVG namespace is a name, never fetched
    assert "//cdn" not in page and "@import" not in page and "url(" not in page
    for attribute in re.findall(r"\s(?:src|href)\s*=\s*[\"']?([^\"'\s>]*)", page):
        assert attribute.startswith("data:"), attribute
    for call in ("fetch(", "XMLHttpRequest", "import(", "WebSocket", "EventSource", "sendBeacon"):
        assert call not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_labels_and_title_cannot_break_the_page(sentences):
    page = explorer_html(sentences, title="<i>attention</i> & </script>")
    parser = Scripts()
    parser.feed(page)
    assert [attrs.get("id") for attrs, _ in parser.scripts] == ["explorer-data", "explorer-weights", None]
    assert page.count("</script>") == 3 and page.count("<script") == 3
    assert "<b>" not in page and "<!--" not in page
    assert "<title>&lt;i&gt;attention&lt;/i&gt; &amp; &lt;/script&gt;</title>" in page
    data, _ = read_page(page)
    assert data["sentences"][3]["tgt"] == NASTY


def test_bad_input_names_the_sentence():
    rng = np.random.default_rng(0)
    s = sentence(rng, 12, GERMAN, ENGLISH)
    s.maps["enc_self"][1] = s.maps["enc_self"][1][:, :-1]
    with pytest.raises(ValueError, match=r"sentence 12: enc_self layer 2 has shape \(3, 6, 7\)"):
        explorer_html([s])
    with pytest.raises(ValueError, match="no cross-attention"):
        explorer_html([ExplorerSentence(1, GERMAN, ENGLISH, ["<s>", *ENGLISH[:-1]], {})])
    s = sentence(rng, 13, GERMAN, ENGLISH, links=[(0, 0), (5, 1)])
    with pytest.raises(ValueError, match=r"sentence 13: links link 5-1 is outside the pair \(5 source words"):
        explorer_html([s])
    s = sentence(rng, 14, GERMAN, ENGLISH, shares={"alti": [0.5] * (len(ENGLISH) - 1)})
    with pytest.raises(ValueError, match=r"sentence 14: shares of 'alti': \d+ values for \d+ target pieces"):
        explorer_html([s])


def test_the_module_needs_no_torch():
    code = ("import sys, attnmt.insight.explorer; "
            "print([m for m in ('torch', 'matplotlib') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_write_explorer_is_atomic_and_counts_bytes(sentences, tmp_path):
    path = tmp_path / "explorer.html"
    written = write_explorer(path, sentences)
    assert written == path.stat().st_size and list(tmp_path.iterdir()) == [path]
    assert path.read_text(encoding="utf-8") == explorer_html(sentences)


# ------------------------------------------------------------------------------------ in a browser

@pytest.fixture(scope="module")
def page_url(sentences, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("explorer") / "explorer page.html"  # a space: the URL is quoted
    write_explorer(path, sentences)
    return path.as_uri()


def open_page(driver, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return window.explorerReady !== undefined || !!window.explorerError"))
    assert driver.execute_script("return window.explorerError || null") is None



def choose(driver, control: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, f"explorer-{control}")).select_by_value(value)


def option_values(driver, control: str) -> list[str]:
    return driver.execute_script(
        f"return [...document.querySelectorAll('#explorer-{control} option')].map((o) => o.value)")


def drawn_cells(driver) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
    """The heatmap as drawn: its data-w as a (rows, cols) array, and the link class of each marked cell."""
    rows, cols, cells = driver.execute_script("""
        const grid = document.getElementById("explorer-heatmap");
        return [Number(grid.dataset.rows), Number(grid.dataset.cols),
                [...grid.querySelectorAll(".cell")].map((c) => [Number(c.dataset.row), Number(c.dataset.col),
                 Number(c.dataset.w), [...c.classList].filter((k) => k.startsWith("link-")).join(" ")])];""")
    weights = np.full((rows, cols), np.nan)
    marks = {}
    for i, j, w, mark in cells:
        weights[i, j] = w
        if mark:
            marks[(i, j)] = mark
    assert not np.isnan(weights).any(), "a cell is missing"
    return weights, marks


def test_the_page_loads_offline_without_errors(browser, page_url):
    browser.get_log("browser"), browser.get_log("performance")  # start from empty logs
    open_page(browser, page_url)
    assert severe(browser) == []
    requested = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requested if m["method"] == "Network.requestWillBeSent"]
    assert page_url in urls
    assert [u for u in urls if u != page_url and not u.startswith(("data:", "blob:", "about:"))] == []
    assert browser.execute_script("return document.body.dataset.draws") == "1"


def test_layer_and_head_choose_the_drawn_weights(browser, page_url, sentences):
    open_page(browser, page_url)
    cross = np.stack(sentences[0].maps["cross"])  # (L, H, T, S)
    default, _ = drawn_cells(browser)  # last layer, average of the heads
    assert np.abs(default - cross[-1].mean(0)).max() <= HALF_STEP + 1e-6
    choose(browser, "layer", "0")
    first, _ = drawn_cells(browser)
    assert np.abs(first - default).max() > 0.05
    assert np.abs(first - cross[0].mean(0)).max() <= HALF_STEP + 1e-6
    choose(browser, "head", "1")
    head, _ = drawn_cells(browser)
    assert np.abs(head - first).max() > 0.05
    assert np.abs(head - cross[0, 1]).max() <= HALF_STEP + 1e-6
    assert severe(browser) == []


def test_hovering_shows_weights(browser, page_url):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_page(browser, page_url)
    tooltip = browser.find_element(By.ID, "explorer-tooltip")
    cell = browser.find_element(By.CSS_SELECTOR, '#explorer-heatmap .cell[data-row="4"][data-col="1"]')
    ActionChains(browser).move_to_element(cell).perform()
    weight = float(cell.get_attribute("data-w"))
    assert tooltip.text == f"{GERMAN[1]} → {ENGLISH[4]}: {weight:.3f}"
    assert tooltip.is_displayed()
    label = browser.find_element(By.CSS_SELECTOR, '#explorer-heatmap .row-label[data-row="2"]')
    ActionChains(browser).move_to_element(label).perform()
    assert tooltip.text.startswith(f"{ENGLISH[2]} ← ")
    highlighted = browser.execute_script(
        "return [...document.querySelectorAll('#explorer-heatmap .cell.hl')].map((c) => c.dataset.row)")
    assert highlighted == ["2"] * len(GERMAN)
    choose(browser, "view", "lines")
    key = browser.find_element(By.CSS_SELECTOR, '#explorer-lines .line-key[data-col="3"]')
    ActionChains(browser).move_to_element(key).perform()
    assert tooltip.text.startswith(f"{GERMAN[3]} → ")
    lit = browser.execute_script(
        "return [...document.querySelectorAll('#explorer-lines .attn-line.hl')].map((l) => l.dataset.col)")
    assert lit and set(lit) == {"3"}
    assert severe(browser) == []


@pytest.mark.parametrize("index", [0, 1], ids=["spaced", "cjk"])
def test_words_merge_as_words_merge_does(browser, page_url, sentences, index):
    open_page(browser, page_url)
    choose(browser, "sentence", str(index))
    s = sentences[index]
    for kind, (rows, cols) in AXES.items():
        choose(browser, "kind", kind)
        choose(browser, "units", "pieces")
        pieces, _ = drawn_cells(browser)
        choose(browser, "units", "words")
        words, _ = drawn_cells(browser)
        row_spec, row_labels = piece_words(getattr(s, rows))
        col_spec, col_labels = piece_words(getattr(s, cols))
        assert words.shape == (len(row_labels), len(col_labels)) != pieces.shape
        # exactly words.merge of what the page holds, and within the summed quantisation error of the input
        np.testing.assert_allclose(words, merge(pieces, row_spec, col_spec), atol=1e-5)
        tolerance = HALF_STEP * len(getattr(s, cols)) + 1e-6
        given = merge(np.stack(s.maps[kind])[-1].mean(0), row_spec, col_spec)
        assert np.abs(words - given).max() <= tolerance
        drawn_labels = browser.execute_script(
            "return [...document.querySelectorAll('#explorer-heatmap .row-label')].map((l) => l.textContent)")
        assert drawn_labels == row_labels
    assert severe(browser) == []


def test_gold_links_are_coloured_by_class(browser, page_url, sentences):
    from selenium.webdriver.common.by import By

    open_page(browser, page_url)
    assert browser.find_element(By.ID, "explorer-aer").text == f"AER {sentences[0].aer:.3f}" == "AER 0.222"
    choose(browser, "units", "pieces")
    assert drawn_cells(browser)[1] == {}  # links are between words
    assert not browser.find_element(By.ID, "explorer-legend").is_displayed()
    choose(browser, "units", "words")
    _, marks = drawn_cells(browser)
    assert marks == EXPECTED_CLASSES
    legend = browser.execute_script("""return Object.fromEntries([...document.querySelectorAll(
        '#explorer-legend .legend-item')].map((i) => [i.dataset.class, Number(i.dataset.count)]))""")
    assert legend == {"link-sure": 3, "link-possible": 1, "link-false": 1, "link-missed": 1}
    assert browser.find_element(By.ID, "explorer-legend").is_displayed()
    choose(browser, "view", "lines")
    lines = browser.execute_script("""return [...document.querySelectorAll('#explorer-lines .align-line')]
        .map((l) => [Number(l.dataset.row), Number(l.dataset.col),
                     [...l.classList].filter((k) => k.startsWith("link-")).join(" ")])""")
    assert {(i, j): mark for i, j, mark in lines} == EXPECTED_CLASSES
    # without gold: every predicted link is one class, and no AER
    choose(browser, "sentence", "1")
    assert browser.find_element(By.ID, "explorer-aer").text == ""
    choose(browser, "view", "heatmap")
    _, marks = drawn_cells(browser)
    assert marks == {(0, 0): "link-predicted", (2, 1): "link-predicted", (7, 4): "link-predicted"}
    assert severe(browser) == []


def test_kinds_have_their_shapes_and_any_script_renders(browser, page_url, sentences):
    from selenium.webdriver.common.by import By

    open_page(browser, page_url)
    for index in (0, 3):
        choose(browser, "sentence", str(index))
        s = sentences[index]
        for kind, (rows, cols) in AXES.items():
            choose(browser, "kind", kind)
            weights, _ = drawn_cells(browser)
            assert weights.shape == (len(getattr(s, rows)), len(getattr(s, cols)))
            np.testing.assert_allclose(weights.sum(1), 1.0, atol=HALF_STEP * weights.shape[1] + 1e-5)
    assert option_values(browser, "layer") == ["0", "1", "2"]  # sentence 4 has 3 layers
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#explorer-heatmap .row-label')].map((l) => l.textContent)")
    assert labels == sentences[3].tgt_in  # </script>, <b> and & as text
    choose(browser, "kind", "cross")
    choose(browser, "sentence", "2")  # Chinese -> Arabic, an LSTM: cross only, one head
    assert option_values(browser, "kind") == ["cross"]
    assert option_values(browser, "head") == ["avg", "0"]
    cols = browser.find_elements(By.CSS_SELECTOR, "#explorer-heatmap .col-label")
    rows = browser.find_elements(By.CSS_SELECTOR, "#explorer-heatmap .row-label")
    assert [c.text for c in cols] == CHINESE and [r.text for r in rows] == ARABIC
    assert all(e.get_attribute("dir") == "auto" for e in cols + rows)
    assert all(e.size["width"] > 0 and e.size["height"] > 0 for e in cols + rows)
    assert browser.execute_script("return getComputedStyle(arguments[0]).direction", rows[0]) == "rtl"
    choose(browser, "units", "words")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#explorer-heatmap .col-label")) == len(
        piece_words(CHINESE)[1])
    browser.find_element(By.ID, "explorer-next").click()
    assert browser.find_element(By.ID, "explorer-number").text == "sentence 4"
    assert severe(browser) == []


def test_a_screenshot_is_not_blank(browser, page_url):
    open_page(browser, page_url)
    png = browser.get_screenshot_as_png()
    assert png.startswith(b"\x89PNG")
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        pytest.fail("Pillow is needed to read the screenshot (it comes with matplotlib)")
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, f"{len(colours or [])} distinct colours"
    background = max(colours)[0] / (image.width * image.height)
    assert background < 0.95


def test_the_attribution_views_draw_their_own_axes(browser, tmp_path):
    """``attnmt attribute --html``: the source and prefix shares as kinds of one layer of one head, rows that
    sum to less than 1 (the rest is the other view's), drawn on their own axes."""
    rng = np.random.default_rng(5)
    src, tgt = ["▁Ein", "▁Fahr", "rad", "</s>"], ["▁A", "▁bicycle", "</s>"]
    s = sentence(rng, 1, src, tgt, layers=2, heads=2, kinds=("cross",))
    total = rng.dirichlet(np.ones(len(src) + len(tgt)), size=len(tgt))  # (T, S + T)
    prefix = np.tril(total[:, len(src):])
    total = np.concatenate([total[:, :len(src)], prefix], axis=1)
    total /= total.sum(1, keepdims=True)
    s.maps["attribution"] = [total[None, :, :len(src)]]
    s.maps["attribution_prefix"] = [total[None, :, len(src):]]
    s.shares = {"attribution": total[:, :len(src)].sum(1)}
    path = tmp_path / "attribution.html"
    write_explorer(path, [s])
    open_page(browser, path.as_uri())
    assert option_values(browser, "kind") == ["cross", "attribution", "attribution_prefix"]
    share_points = ("return document.getElementById('explorer-share').hidden ? null : [...document"
                    ".querySelectorAll('#explorer-share-line .share-point')]"
                    ".map((p) => Number(p.dataset.share))")
    assert browser.execute_script(share_points) is None  # cross-attention has no share line
    for kind in ("attribution", "attribution_prefix"):  # both views show the source's share
        choose(browser, "kind", kind)
        drawn = browser.execute_script(share_points)
        np.testing.assert_allclose(drawn, total[:, :len(src)].sum(1), atol=1e-4)
    for kind, expected in (("attribution", total[:, :len(src)]), ("attribution_prefix", total[:, len(src):])):
        choose(browser, "kind", kind)
        assert option_values(browser, "head") == ["avg", "0"]
        weights, _ = drawn_cells(browser)
        np.testing.assert_allclose(weights, expected, atol=HALF_STEP + 1e-6)
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#explorer-heatmap .col-label')].map((l) => l.textContent)")
    assert labels == s.tgt_in
    assert severe(browser) == []

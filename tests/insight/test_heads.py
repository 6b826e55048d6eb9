"""``attnmt heads``: the pattern classifier on hand-built maps (each pattern, the thresholds' boundaries, the
order of the rules), head masking against a copy of the model whose ``out_proj`` columns for the head are
zero, importance and pruning on a tiny trained Transformer, the command end to end, its page in headless
Chromium, and bad input (one error line each)."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
import torch
from helpers import expect_error, severe, trained_for_decoding
from test_explorer import NASTY, Scripts
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.decoding.search import greedy_search
from attnmt.errors import ConfigError
from attnmt.insight.head_patterns import (
    BLOCK_MIN,
    DISPERSED_MIN,
    KINDS,
    PATTERNS,
    POSITIONAL_MIN,
    STRIPE_MIN,
    WINDOW,
    HeadScores,
    anchors,
    classify,
    head_scores,
    is_delimiter,
)
from attnmt.insight.heads import (
    Head,
    HeadsOptions,
    HeadsReport,
    Judge,
    Pruned,
    explain_heads,
    head_ids,
    masked_heads,
    model_pairs,
    share,
)
from attnmt.insight.heads_page import Sample, heads_html, write_heads_page
from attnmt.models import build_model

# ------------------------------------------------------------------------------ patterns on built maps

S = 20  # keys (and queries) of the self-attention maps below
FAR = 10  # a key this far from the query: outside the window of WINDOW


def rows_with(entries, size: int = S) -> np.ndarray:
    """(1, size, size): row i holds ``entries(i)``, a dict key -> weight."""
    weights = np.zeros((1, size, size))
    for i in range(size):
        for j, w in entries(i).items():
            weights[0, i, j] += w
    return weights


def one(maps: np.ndarray, kind: str = "enc_self", delimiters=None) -> HeadScores:
    (scores,) = head_scores([maps], kind, None if delimiters is None else [delimiters])
    return scores


def far(i: int, size: int = S) -> int:
    return (i + FAR) % size


def test_positional_heads_by_offset():
    diagonal = one(np.eye(S)[None])
    assert (diagonal.pattern, diagonal.score, diagonal.confidence, diagonal.entropy) == ("diagonal", 1, 1, 0)
    previous = one(rows_with(lambda i: {max(i - 1, 0): 1.0}))
    assert (previous.pattern, previous.score) == ("previous", 1.0)  # row 0 has no previous key: left out
    nxt = one(rows_with(lambda i: {min(i + 1, S - 1): 1.0}))
    assert (nxt.pattern, nxt.score) == ("next", 1.0)
    # Decoder self-attention is causal: a previous-token head there; the next key is never visible.
    causal = one(rows_with(lambda i: {max(i - 1, 0): 1.0}), "dec_self")
    assert (causal.pattern, causal.next) == ("previous", 0.0)
    # Cross-attention: the proportional position round(i (S - 1) / (T - 1)).
    assert anchors(3, 5, cross=True).tolist() == [0, 2, 4] and anchors(1, 9, cross=True).tolist() == [0]
    assert anchors(5, 9, cross=True).tolist() == [0, 2, 4, 6, 8]
    T, cols = 7, 13
    cross = np.zeros((1, T, cols))
    cross[0, np.arange(T), anchors(T, cols, True)] = 1.0
    assert one(cross, "cross").pattern == "diagonal"
    shifted = np.zeros((1, T, cols))
    shifted[0, np.arange(T), np.maximum(anchors(T, cols, True) - 1, 0)] = 1.0
    assert one(shifted, "cross").pattern == "previous"


def test_stripe_block_dispersed_and_long_range():
    eos = np.zeros(S, dtype=bool)
    eos[-1] = True
    rest = 0.4 / (S - 1)
    stripe = one(rows_with(lambda i: {S - 1: 0.6, **{j: rest for j in range(S - 1)}}), delimiters=eos)
    assert stripe.pattern == "stripe" and stripe.score == pytest.approx(0.6)
    punctuation = np.zeros(S, dtype=bool)
    punctuation[[4, 12]] = True  # two "." pieces
    dots = one(rows_with(lambda i: {4: 0.35, 12: 0.35, far(i): 0.3}), delimiters=punctuation)
    assert dots.pattern == "stripe"
    near = rows_with(lambda i: {j: 1.0 for j in range(max(i - 2, 0), min(i + 3, S))})
    band = one(near / near.sum(-1, keepdims=True))  # |j - i| <= 2, evenly: at most 1/3 on any offset
    assert (band.pattern, band.score) == ("block", 1.0)
    uniform = one(np.full((1, S, S), 1.0 / S))
    assert uniform.pattern == "dispersed" and uniform.score == pytest.approx(1.0)
    assert uniform.confidence == pytest.approx(1 / S) and uniform.entropy == pytest.approx(np.log(S))
    sparse = one(rows_with(lambda i: {far(i): 1.0}))
    assert (sparse.pattern, sparse.score) == ("long-range", 1.0)
    # Causal rows are normalised by the keys they may see: uniform over j <= i is fully dispersed.
    causal = np.tril(np.ones((S, S)))
    assert one((causal / causal.sum(-1, keepdims=True))[None], "dec_self").dispersed == pytest.approx(1.0)


def test_the_thresholds_boundaries_and_order():
    none = {"diagonal": 0.0, "previous": 0.0, "next": 0.0}
    assert classify({**none, "diagonal": POSITIONAL_MIN}, 0, 0, 0, 0) == ("diagonal", POSITIONAL_MIN)
    assert classify({**none, "diagonal": np.nextafter(POSITIONAL_MIN, 0)}, 0, 0, 0, 0)[0] == "long-range"
    assert classify({**none, "next": 0.7, "previous": 0.7}, 0, 0, 0, 0) == ("previous", 0.7)  # ties: order
    assert classify(none, STRIPE_MIN, 0, 0, 0) == ("stripe", STRIPE_MIN)
    assert classify(none, np.nextafter(STRIPE_MIN, 0), 0, 0, 0)[0] == "long-range"
    assert classify(none, 0, BLOCK_MIN, 0, 0.9) == ("block", BLOCK_MIN)
    assert classify(none, 0, np.nextafter(BLOCK_MIN, 0), 0, 0.3) == ("long-range", 0.7)  # 1 - local
    assert classify(none, 0, 0, DISPERSED_MIN, 0) == ("dispersed", DISPERSED_MIN)
    assert classify(none, 0, 0, np.nextafter(DISPERSED_MIN, 0), 0)[0] == "long-range"
    # The order: a positional head is one whatever else holds; a stripe before a block before dispersed.
    assert classify({**none, "diagonal": 0.5}, 1.0, 1.0, 1.0, 1.0)[0] == "diagonal"
    assert classify(none, 0.5, 1.0, 1.0, 1.0)[0] == "stripe"
    assert classify(none, 0, 0.5, 1.0, 1.0)[0] == "block"
    # On maps, a hair either side of each threshold.
    for w, expected in ((0.51, "diagonal"), (0.49, "long-range")):
        assert one(rows_with(lambda i, w=w: {i: w, far(i): 1 - w})).pattern == expected
    eos = np.zeros(S, dtype=bool)
    eos[-1] = True
    for w, expected in ((0.51, "stripe"), (0.49, "long-range")):
        on_eos = rows_with(lambda i, w=w: {S - 1: w, (i + FAR) % (S - 1): 1 - w})
        assert one(on_eos, delimiters=eos).pattern == expected

    def split(i, w):  # w in the window, two and three keys away from i, the rest far away
        step = 1 if i < S // 2 else -1
        return {i + 2 * step: w / 2, i + WINDOW * step: w / 2, far(i): 1 - w}

    def chance_corrected(w):  # the block score of split(., w), row by row: (m - u) / (1 - u)
        u = np.array([(min(i + WINDOW, S - 1) - max(i - WINDOW, 0) + 1) / S for i in range(S)])
        return float(np.mean((w - u) / (1 - u)))

    for w in (0.3, 0.6, 0.9):
        head = one(rows_with(lambda i, w=w: split(i, w)))
        assert head.local == pytest.approx(w) and head.block == pytest.approx(chance_corrected(w))
    low, high = 0.5, 1.0  # bisect for the w where the block score is BLOCK_MIN, then step either side
    for _ in range(50):
        low, high = (low, (low + high) / 2) if chance_corrected((low + high) / 2) >= BLOCK_MIN else \
            ((low + high) / 2, high)
    assert one(rows_with(lambda i: split(i, high + 0.01))).pattern == "block"
    assert one(rows_with(lambda i: split(i, low - 0.01))).pattern == "long-range"
    # A uniform head on a sentence of 8 pieces puts 44/64 of its mass in the window by chance: no block.
    short = one(np.full((1, 8, 8), 1 / 8))
    assert short.local == pytest.approx(44 / 64) and short.block == pytest.approx(0.0)
    assert short.pattern == "dispersed"
    # The identity is also a block and concentrated: the diagonal rule comes first.
    assert one(np.eye(S)[None]).block == 1.0


def test_delimiters_and_bad_maps():
    for piece in ("<s>", "</s>", ".", "\u2581.", "\u2581,", "?!", "\u2581\u00bb", "\u3002"):
        assert is_delimiter(piece), piece
    for piece in ("\u2581a", "\u2581", "a.", "\u2581Mann", "<pad>", "1"):
        assert not is_delimiter(piece), piece
    with pytest.raises(ValueError, match="unknown attention kind"):
        head_scores([np.eye(3)[None]], "self")
    with pytest.raises(ValueError, match="delimiter flags"):
        head_scores([np.eye(3)[None]], "enc_self", [np.zeros(4, dtype=bool)])


# ------------------------------------------------------------------------------------------ masking

VOCAB = 24


def tiny_transformer(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(arch="transformer", d_model=12, n_heads=3, enc_layers=2, dec_layers=2, d_ff=16,
                            dropout=0.0)
    return build_model(cfg, VOCAB, VOCAB).eval()


def zeroed(model, heads):
    """A copy of ``model`` whose out_proj weight columns for each of ``heads`` are zero."""
    other = copy.deepcopy(model)
    modules = {("enc_self", k): layer.self_attn for k, layer in enumerate(other.encoder)}
    modules.update({("dec_self", k): layer.self_attn for k, layer in enumerate(other.decoder)})
    modules.update({("cross", k): layer.cross_attn for k, layer in enumerate(other.decoder)})
    with torch.no_grad():
        for kind, layer, h in heads:
            module = modules[(kind, layer)]
            module.out_proj.weight[:, h * module.d_head:(h + 1) * module.d_head] = 0.0
    return other


BATCH = collate([[5, 6, 7, 8, 9], [10, 11, 12]], [[13, 14, 15, 16], [17, 18]])


@torch.no_grad()
def logits(model, batch=BATCH):
    return model(batch).logits


def test_masking_a_head_is_zeroing_its_out_proj_columns():
    model = tiny_transformer()
    plain = logits(model)
    for heads in ([("enc_self", 0, 1)], [("dec_self", 1, 2)], [("cross", 0, 0)],
                  [("enc_self", 1, 0), ("cross", 1, 2), ("cross", 1, 0)]):
        with masked_heads(model, heads):
            masked = logits(model)
            found = greedy_search(model, BATCH.src, BATCH.src_mask, 1.0, 4)
        assert torch.allclose(masked, logits(zeroed(model, heads)), atol=1e-6), heads
        assert not torch.allclose(masked, plain, atol=1e-4), heads
        expected = greedy_search(zeroed(model, heads), BATCH.src, BATCH.src_mask, 1.0, 4)
        assert [h.tokens for h in found] == [h.tokens for h in expected]
    assert torch.equal(logits(model), plain)  # the hooks are gone
    assert all(not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(RuntimeError, match="inside"), masked_heads(model, [("cross", 0, 0)]):
        raise RuntimeError("inside")
    assert all(not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ValueError, match="no head cross layer 0 head 3"):
        with masked_heads(model, [("cross", 0, 3)]):
            pass


def test_every_head_masked_leaves_each_position_alone():
    """With every head of every kind masked, no position reads another: the logits at a target position
    depend on its own input token and position only, not on the source or the other target tokens."""
    model = tiny_transformer(1)
    ids = head_ids(model)
    assert len(ids) == 3 * 2 * 3 and ids[0] == ("enc_self", 0, 0) and ids[-1] == ("cross", 1, 2)
    one_pair = collate([[5, 6, 7, 8]], [[13, 14, 15]])
    other = collate([[9, 10]], [[20, 14, 21]])  # same second input token (13 -> 20 changes the first)
    with masked_heads(model, ids):
        a, b = logits(model, one_pair), logits(model, other)
    assert torch.allclose(a[0, 2], b[0, 2], atol=1e-6)  # input 14 at position 2 in both
    assert not torch.allclose(logits(model, one_pair)[0, 2], logits(model, other)[0, 2], atol=1e-4)


def test_an_lstm_is_refused():
    lstm = build_model(LSTMConfig(arch="lstm", emb_dim=6, hidden_size=5, attn_dim=4), VOCAB, VOCAB)
    with pytest.raises(ConfigError, match="heads needs a Transformer model"):
        head_ids(lstm)


# ------------------------------------------------------------------------------- a tiny trained model

SOURCES = ["monday , 3 june 2001", "the 5th of may 1999", "friday 12 october 1875", "sunday , 30 april 2024",
           "tuesday the 1st of march 1901", "7 july 1970", "wednesday , 9 august 2012", "june 4 , 1989"]


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("heads") / "run")


@pytest.fixture(scope="module")
def translator(run):
    from attnmt.cli.common import open_translator
    from attnmt.decoding.translator import DecodeOverrides

    torch.set_num_threads(1)
    found, _, _ = open_translator(run, "cpu", DecodeOverrides(1), exports=False)
    return found


def test_importance_ranking_and_pruning(translator):
    pairs = model_pairs(translator, SOURCES, None)  # against its own translations: unmasked BLEU 100
    options = HeadsOptions(prune=(0.0, 0.5, 1.0), random_draws=2, seed=3, sample=2)
    report = explain_heads(translator, pairs, "de", options)
    ids = head_ids(translator.model)
    assert [(h.kind, h.layer, h.head) for h in report.heads] == ids and len(ids) == 6
    assert report.bleu == pytest.approx(100.0) and report.pairs == len(SOURCES)
    judge = Judge(translator, pairs, "de")
    assert report.loss == pytest.approx(judge.loss())
    with masked_heads(translator.model, [ids[4]]):
        assert report.heads[4].delta_loss == pytest.approx(judge.loss() - report.loss)
        assert report.heads[4].delta_bleu == pytest.approx(judge.bleu() - report.bleu)
    none, half, every = report.pruned
    assert none.heads == [] and none.bleu == report.bleu and none.loss == pytest.approx(report.loss)
    assert every.heads and len(every.heads) == 6 and every.bleu < report.bleu and every.loss > report.loss
    by_importance = sorted(report.heads, key=lambda h: h.delta_loss)
    assert half.heads == [(h.kind, h.layer, h.head) for h in by_importance[:3]]
    assert [len(r.heads) for r in report.random] == [share(0.25, 6)] * 2 == [2, 2]
    assert report.random_bleu == pytest.approx(np.mean([r.bleu for r in report.random]))
    again = explain_heads(translator, pairs, "de", HeadsOptions(prune=(), random_draws=2, seed=3, bleu=False))
    assert [r.heads for r in again.random] == [r.heads for r in report.random]  # seeded
    assert all(h.delta_bleu is None for h in again.heads)
    assert report.sample.number == 3 and report.sample.src[-1] == "</s>"
    assert report.sample.maps["cross"][0].shape == (2, len(report.sample.tgt), len(report.sample.src))
    counts = report.counts()
    assert counts.keys() == set(KINDS) and sum(sum(c.values()) for c in counts.values()) == 6


# ------------------------------------------------------------------------------------------ the command


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads_files")
    src, tgt = root / "src.en", root / "tgt.de"
    src.write_text("\n".join(SOURCES[:6]) + "\n", encoding="utf-8")
    tgt.write_text("montag , 3. juni 2001\n5. mai 1999\nfreitag , 12. oktober 1875\n"
                   "sonntag , 30. april 2024\ndienstag , 1. märz 1901\n7. juli 1970\n", encoding="utf-8")
    return root, src, tgt


def test_the_command_end_to_end(run, files):
    root, src, tgt = files
    result = invoke("heads", run, "--src", src, "--tgt", tgt, "--limit", 5, "--json", root / "heads.json",
                    "--html", root / "heads.html", "--sentence", 2, "--random-draws", 3)
    assert result.exit_code == 0, result.output
    for text in ("every head", "patterns per kind", "pruned 10% by importance (1 head)",
                 "pruned 25% by importance (2 heads)", "pruned 50% by importance (3 heads)",
                 "pruned 25% at random (2 heads, mean of 3)", "encoder self", "cross"):
        assert text in result.stdout, text
    data = json.loads((root / "heads.json").read_text(encoding="utf-8"))
    assert data["pairs"] == 5 and data["references"] == "targets" and data["sample"] == 2
    assert len(data["heads"]) == 6 and {h["layer"] for h in data["heads"]} == {1}
    assert {h["head"] for h in data["heads"]} == {1, 2}
    assert all(h["pattern"] in PATTERNS for h in data["heads"])
    for h in data["heads"]:
        assert h["delta_bleu"] is not None and h["score"] >= 0 and 0 < h["confidence"] <= 1
    assert sum(sum(c.values()) for c in data["pattern_counts"].values()) == 6
    assert [p["fraction"] for p in data["pruned"]] == [0.1, 0.25, 0.5] and len(data["random"]["draws"]) == 3
    page = (root / "heads.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in page and page.count("<script") == 2
    assert f"wrote {root / 'heads.html'}" in result.stdout


def test_json_onto_stdout_without_targets_and_bleu(run, files):
    _, src, _ = files
    result = invoke("heads", run, "--src", src, "--limit", 3, "--json", "-", "--no-bleu", "--random-draws", 1)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # the table went to stderr
    assert data["references"] == "own translations" and data["bleu"] == pytest.approx(100.0)
    assert all(h["delta_bleu"] is None for h in data["heads"]) and "every head" in result.stderr


def test_bad_input_is_one_error_line(run, files, tiny, tmp_path):
    root, src, tgt = files
    short, empty, gap = tmp_path / "short.de", tmp_path / "empty.en", tmp_path / "gap.en"
    short.write_text("eins\nzwei\n", encoding="utf-8")
    empty.write_text("", encoding="utf-8")
    gap.write_text("monday , 3 june 2001\n\n7 july 1970\n", encoding="utf-8")
    expect_error(invoke("heads", run, "--src", src, "--tgt", short), 3, "has 6 lines", "has 2")
    expect_error(invoke("heads", run, "--src", empty), 3, "no sentences")
    expect_error(invoke("heads", run, "--src", src, "--sentence", 7), 2, "--sentence 7", "6 sentence(s)")
    expect_error(invoke("heads", run, "--src", src, "--limit", 2, "--sentence", 3), 2, "2 sentence(s)")
    expect_error(invoke("heads", run, "--src", src, "--sentence", 0), 2, "--sentence")
    expect_error(invoke("heads", run, "--src", gap, "--sentence", 2, "--no-bleu"), 3, "line 2", "is empty")
    expect_error(invoke("heads", tiny.reference("lstm"), "--src", src), 2, "heads needs a Transformer model")
    expect_error(invoke("heads", run, "--src", src, "--json", src), 2, "--json", "refusing to overwrite")
    expect_error(invoke("heads", run, "--src", src, "--json", tmp_path / "a", "--html", tmp_path / "a"), 2,
                 "also --json")


def test_the_help_states_the_thresholds():
    from attnmt.cli.heads import heads

    text = " ".join(heads.__doc__.split())
    for threshold in (f"p(i)+1 >= {POSITIONAL_MIN}", f"punctuation pieces >= {STRIPE_MIN}",
                      f"share of the keys, >= {BLOCK_MIN}", f"log(visible keys) >= {DISPERSED_MIN}"):
        assert threshold in text, threshold


# ------------------------------------------------------------------------------------------ the page

COLOURS = {}  # pattern -> "rgb(...)", as the page draws them (filled in by the browser test)


def synthetic_report() -> HeadsReport:
    """Nine heads (three per kind, one layer) whose patterns run through all seven, and a sentence whose
    every map has weight 1 in its first cell (row 0 one-hot at column 0)."""
    rng = np.random.default_rng(0)
    ids = [(kind, 0, h) for kind in KINDS for h in range(3)]
    heads = [Head(kind, layer, h, HeadScores(PATTERNS[n % len(PATTERNS)], 0.5 + n / 100, 0.1, 0.1, 0.1, 0.2,
                                             0.3, 0.6, 0.4, 0.5, 1.5), n / 10, -n / 5)
             for n, (kind, layer, h) in enumerate(ids)]
    src = ["\u2581ein", "\u2581Mann", ".", "</s>"]
    tgt = [*NASTY[:-1], "</s>"]
    tgt_in = ["<s>", *tgt[:-1]]
    shapes = {"enc_self": (len(src), len(src)), "dec_self": (len(tgt_in), len(tgt_in)),
              "cross": (len(tgt), len(src))}
    maps = {}
    for kind, (rows, cols) in shapes.items():
        weights = rng.dirichlet(np.ones(cols), size=(3, rows))
        weights[:, 0] = 0.0
        weights[:, 0, 0] = 1.0
        maps[kind] = [weights]
    return HeadsReport(heads, pairs=4, tokens=40, own=False, beam_size=1, loss=2.0, bleu=30.0,
                       pruned=[Pruned(0.1, ids[:1], 2.1, 29.0), Pruned(0.5, ids[:4], 2.9, 12.5)],
                       random=[Pruned(0.25, ids[2:4], 2.3, 25.0), Pruned(0.25, ids[5:7], 2.5, 21.0)],
                       sample=Sample(7, src, tgt, tgt_in, maps))


@pytest.fixture(scope="module")
def page_url(tmp_path_factory) -> str:
    report = synthetic_report()
    path = tmp_path_factory.mktemp("heads_page") / "heads page.html"
    written = write_heads_page(path, report.as_dict(), report.sample, title="<i>heads</i> & </script>")
    assert written == path.stat().st_size
    return path.as_uri()


def test_the_page_escapes_everything_and_loads_nothing():
    report = synthetic_report()
    page = heads_html(report.as_dict(), report.sample, title="<i>heads</i> & </script>")
    parser = Scripts()
    parser.feed(page)
    assert [attrs.get("id") for attrs, _ in parser.scripts] == ["heads-data", None]
    assert page.count("</script>") == 2 and "<b>" not in page and "<!--" not in page
    data = json.loads(parser.scripts[0][1])
    assert data["sample"]["tgt"][:-1] == NASTY[:-1] and data["title"] == "<i>heads</i> & </script>"
    assert set(re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"'<>)]*", page, re.I)) == set()
    assert "default-src 'none'" in page and "url(" not in page and "fetch(" not in page
    with pytest.raises(ValueError, match=r"enc_self layer 1 has shape \(3, 4, 3\)"):
        broken = synthetic_report()
        broken.sample.maps["enc_self"] = [broken.sample.maps["enc_self"][0][:, :, :3]]
        heads_html(broken.as_dict(), broken.sample)


def open_page(driver, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return window.headsReady !== undefined || !!window.headsError"))
    assert driver.execute_script("return window.headsError || null") is None


def test_the_page_draws_a_heatmap_per_head_in_its_patterns_colour(browser, page_url):
    browser.get_log("browser"), browser.get_log("performance")
    open_page(browser, page_url)
    assert severe(browser) == []
    requested = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requested if m["method"] == "Network.requestWillBeSent"]
    assert [u for u in urls if u != page_url and not u.startswith(("data:", "blob:", "about:"))] == []
    figures = browser.execute_script("""return [...document.querySelectorAll('#heads-maps figure.head-map')]
        .map((f) => { const c = f.querySelector('canvas');
          const px = c.getContext('2d').getImageData(0, 0, 1, 1).data;
          return [f.dataset.kind, Number(f.dataset.layer), Number(f.dataset.head), f.dataset.pattern,
                  getComputedStyle(f).borderTopColor, 'rgb(' + px[0] + ', ' + px[1] + ', ' + px[2] + ')',
                  c.width > 0 && c.height > 0]; });""")
    report = synthetic_report()
    expected = [(h.kind, h.layer + 1, h.head + 1, h.scores.pattern) for h in report.heads]
    assert [tuple(f[:4]) for f in figures] == expected  # one heatmap per head, in order
    legend = dict(browser.execute_script("""
        return [...document.querySelectorAll('#heads-legend .legend-item')]
        .map((i) => [i.dataset.pattern, getComputedStyle(i.querySelector('.swatch')).backgroundColor]);"""))
    assert list(legend) == list(PATTERNS) and len(set(legend.values())) == len(PATTERNS)  # distinct colours
    for kind, _, head, pattern, border, first_cell, drawn in figures:
        assert border == legend[pattern] == first_cell and drawn, (kind, head, pattern)
    counts = browser.execute_script("""return [...document.querySelectorAll('#heads-legend .legend-item')]
        .map((i) => Number(i.dataset.count));""")
    assert counts == [sum(h.scores.pattern == p for h in report.heads) for p in PATTERNS]
    rows = browser.execute_script("return [...document.querySelectorAll('#heads-table tr[data-pattern]')]"
                                  ".map((r) => r.dataset.pattern)")
    assert rows == [h.scores.pattern for h in report.heads]
    pruning = browser.execute_script("return [...document.querySelectorAll('#heads-pruning tr[data-how]')]"
                                     ".map((r) => [r.dataset.how, r.cells[2].textContent])")
    assert pruning == [["importance", "29.00"], ["importance", "12.50"], ["random", "23.00"]]
    assert severe(browser) == []


def test_hovering_a_heatmap_names_the_cell(browser, page_url):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_page(browser, page_url)
    canvas = browser.find_element(By.CSS_SELECTOR, 'figure.head-map[data-kind="cross"][data-head="2"] canvas')
    size = canvas.size
    cell = size["width"] / 4  # four source pieces
    ActionChains(browser).move_to_element_with_offset(canvas, -size["width"] / 2 + cell / 2,
                                                      -size["height"] / 2 + 1).perform()
    tip = browser.find_element(By.ID, "heads-tooltip").text
    assert tip == f"cross L1 H2: \u2581ein \u2192 {NASTY[0]} 1.000", tip
    assert severe(browser) == []

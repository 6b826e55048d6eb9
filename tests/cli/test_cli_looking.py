"""``attnmt plot``, ``align`` and ``plot-curves`` on small models trained once for this module.

An LSTM learns the toy task well enough that its attention aligns words; its alignment error rate on
the toy test set must beat a diagonal baseline, computed here from the same gold file. A tiny
Transformer, barely trained (with ``train.plot_every`` on), gives the layer and head structure the
figures are drawn from. Commands run in-process (``CliRunner``) to keep the module fast.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys

import numpy as np
import pytest
from helpers import TOY_ALIGN_BASE, assert_one_error_line
from PIL import Image
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.insight.links import alignment_scores, parse_pharaoh

TOY_TEST = 100
# The toy task, a 100-piece joint tokenizer; small models, dropout off so that 200 steps do (the LSTM's
# AER beats the diagonal's by 0.23 there as at 300 steps; by 0.12 at 125 and not at all at 100).
BASE = TOY_ALIGN_BASE
MODELS = {
    "lstm": {"arch": "lstm", "emb_dim": 32, "hidden_size": 32, "attn_dim": 32, "enc_layers": 1,
             "dec_layers": 1, "dropout": 0.0},
    "transformer": {"arch": "transformer", "d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 2,
                    "d_ff": 32, "dropout": 0.0},
}
# The Transformer only needs its shape: a few steps, a validation (with heatmaps) every 2.
TRANSFORMER_SETS = ["train.max_steps=4", "train.eval_every=2", "train.plot_every=1", "train.save_every=4"]
# The reverse LSTM only needs to read German into English: no test scores its alignments.
REVERSE_SETS = ["train.max_steps=50", "train.eval_every=50", "train.save_every=50"]
# The gradient attribution's AER is scored on the first pairs of the test set (one backward pass per
# target piece: the 100 pairs took 25 s, these 30 beat the diagonal by as much).
GRADIENT_PAIRS = 30


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Trained run folders {"lstm": ..., "transformer": ...} and the toy test files (en, de, align)."""
    root = tmp_path_factory.mktemp("align")
    runs = {}
    for arch, model in MODELS.items():
        config = root / f"{arch}.yaml"
        config.write_text(json.dumps({**BASE, "model": model}), encoding="utf-8")
        run = root / arch
        if runs:  # same data and tokenizer settings: reuse the prepared data
            first = next(iter(runs.values()))
            shutil.copytree(first / "data", run / "data")
            shutil.copytree(first / "tokenizer", run / "tokenizer")
            shutil.copy(first / "config.yaml", run / "config.yaml")
        sets = [x for item in (TRANSFORMER_SETS if arch == "transformer" else []) for x in ("--set", item)]
        result = invoke("train", config, "--run-dir", run, *sets)
        assert result.exit_code == 0, result.output
        runs[arch] = run
    data = root / "toy"
    assert invoke("toy-data", data, "--train-size", 2000, "--dev-size", 20,
                  "--test-size", TOY_TEST).exit_code == 0
    # The LSTM the other way, German to English, on the same pairs as files (for align --reverse).
    reverse = {**BASE, "model": MODELS["lstm"],
               "data": {"src_lang": "de", "tgt_lang": "en",
                        "train": {"src": str(data / "train.de"), "tgt": str(data / "train.en")},
                        "dev": {"src": str(data / "dev.de"), "tgt": str(data / "dev.en")}}}
    config = root / "reverse.yaml"
    config.write_text(json.dumps(reverse), encoding="utf-8")
    sets = [x for item in REVERSE_SETS for x in ("--set", item)]
    result = invoke("train", config, "--run-dir", root / "reverse", *sets)
    assert result.exit_code == 0, result.output
    runs["reverse"] = root / "reverse"
    return runs, {suffix: data / f"test.{suffix}" for suffix in ("en", "de", "align")}


def lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# ------------------------------------------------------------------------------------------- plot


def test_plot_transformer_writes_every_layer_kind_and_the_chosen_head(toy, tmp_path):
    runs, _ = toy
    out = tmp_path / "maps"
    result = invoke("plot", runs["transformer"], "tuesday , march 14th , 2019", "may 1st 2001",
                    "--out", out, "--self")
    assert result.exit_code == 0, result.output
    expected = {f"{n:04d}_{kind}_layer{layer}.png" for n in (1, 2) for kind, layers in
                (("cross", (1, 2)), ("dec_self", (1, 2)), ("enc_self", (1,)))
                for layer in layers}  # fmt: skip
    assert {p.name for p in out.iterdir()} == expected
    with Image.open(out / "0001_cross_layer2.png") as image:
        assert image.width > 200 and image.height > 100

    out = tmp_path / "one"
    result = invoke("plot", runs["transformer"], "may 1st 2001", "--out", out, "--layer", 2, "--head", 1,
                    "--format", "pdf", "--words")
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["0001_cross_layer2_head1.pdf"]


def test_plot_lstm_reads_a_file_skips_empty_lines_and_stops_at_limit(toy, tmp_path):
    runs, _ = toy
    source = tmp_path / "in.en"
    source.write_text("march 14th 2019\n\nfriday the 1st of may 2001\nnovember 19th 1982\n", encoding="utf-8")
    out = tmp_path / "maps"
    result = invoke("plot", runs["lstm"], "--input", source, "--limit", 3, "--out", out,
                    "--format", "svg", "--dpi", 50)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["0001_cross_layer1.svg", "0003_cross_layer1.svg"]


def test_training_wrote_heatmaps_and_plot_curves_animates_them(toy):
    runs, _ = toy
    plots = runs["transformer"] / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["step_00000002", "step_00000004"]
    assert sorted(p.name for p in (plots / "step_00000004").iterdir()) == [
        f"{n:04d}_cross_layer{layer}.png" for n in (1, 2, 3) for layer in (1, 2)
    ]
    result = invoke("plot-curves", runs["transformer"], "--gif")
    assert result.exit_code == 0, result.output
    with Image.open(runs["transformer"] / "curves.png") as image:
        assert image.size == (1000, 400)
    with Image.open(plots / "0001_cross_layer2.gif") as gif:
        assert gif.n_frames == 2


def test_a_failing_plot_never_stops_training(toy, tmp_path, monkeypatch, caplog):
    import attnmt.insight.plot

    def broken(*args, **kwargs):
        raise RuntimeError("no figure today")

    monkeypatch.setattr(attnmt.insight.plot, "sentence_maps", broken)
    runs, _ = toy
    run = tmp_path / "run"
    for part in ("data", "tokenizer"):
        shutil.copytree(runs["lstm"] / part, run / part)
    shutil.copy(runs["lstm"] / "config.yaml", run / "config.yaml")
    sets = [x for item in ("train.max_steps=2", "train.eval_every=1", "train.plot_every=1")
            for x in ("--set", item)]
    with caplog.at_level(logging.WARNING, logger="attnmt.training.validation"):
        result = invoke("train", runs["transformer"].parent / "transformer.yaml", "--run-dir", run, *sets)
    assert result.exit_code == 0, result.output
    assert caplog.text.count("could not plot the dev attention: RuntimeError: no figure today") == 2
    assert (run / "checkpoints" / "step_00000002.pt").is_file()


# ------------------------------------------------------------------------------------------ align


def test_align_own_translations_one_line_per_pair_with_valid_indices(toy, tmp_path):
    runs, files = toy
    out, hyps = tmp_path / "out.align", tmp_path / "hyp.de"
    result = invoke("align", runs["lstm"], "--src", files["en"], "--output", out, "--hyp-out", hyps)
    assert result.exit_code == 0, result.output
    sources, targets, links = lines(files["en"]), lines(hyps), lines(out)
    assert len(links) == len(sources) == len(targets) == TOY_TEST
    for src, tgt, line in zip(sources, targets, links):
        pairs = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert len({j for _, j in pairs}) == len(pairs) <= len(tgt.split())  # mutual: at most one per word
        assert all(0 <= i < len(src.split()) and 0 <= j < len(tgt.split()) for i, j in pairs)
    one_based = invoke("align", runs["lstm"], "--src", files["en"], "--tgt", hyps, "--one-based")
    assert one_based.exit_code == 0, one_based.output
    shifted = [" ".join(f"{int(i) + 1}-{int(j) + 1}" for i, j in (x.split("-") for x in line.split()))
               for line in links]
    assert one_based.stdout.splitlines() == shifted


def diagonal_aer(files) -> float:
    """Baseline: source word i linked to target word round(i * T / S)."""
    predicted, sure, possible = [], [], []
    for src, tgt, gold in zip(lines(files["en"]), lines(files["de"]), lines(files["align"])):
        S, T = len(src.split()), len(tgt.split())
        predicted.append({(i, min(T - 1, round(i * T / S))) for i in range(S)})
        s, p = parse_pharaoh(gold)
        sure.append(s)
        possible.append(p)
    return alignment_scores(predicted, sure, possible).aer


def test_trained_lstm_aligns_better_than_the_diagonal(toy):
    runs, files = toy
    result = invoke("align", runs["lstm"], "--src", files["en"], "--tgt", files["de"],
                    "--gold", files["align"], "--json")
    assert result.exit_code == 0, result.output
    score = json.loads(result.stdout)
    baseline = diagonal_aer(files)
    print(f"toy AER: LSTM attention {score['aer']:.3f}, diagonal baseline {baseline:.3f}")
    assert score["aer"] < baseline - 0.05
    assert score["sentences"] == TOY_TEST and 0 < score["precision"] <= 1 and 0 < score["recall"] <= 1

    table = invoke("align", runs["lstm"], "--src", files["en"], "--tgt", files["de"],
                   "--gold", files["align"], "--method", "threshold", "--threshold", "0.4")  # fmt: skip
    assert table.exit_code == 0, table.output
    assert "AER" in table.stdout and "recall" in table.stdout

    transformer = invoke("align", runs["transformer"], "--src", files["en"], "--tgt", files["de"],
                         "--gold", files["align"], "--layer", "avg", "--json")  # fmt: skip
    assert transformer.exit_code == 0, transformer.output
    assert 0 <= json.loads(transformer.stdout)["aer"] <= 1


def test_align_heads_shift_and_reverse_symmetrization(toy, tmp_path):
    runs, files = toy
    common = ["--src", files["en"], "--tgt", files["de"]]

    def links(*args):
        result = invoke("align", runs["transformer"], *common, *args)
        assert result.exit_code == 0, result.output
        return [set(parse_pharaoh(line)[0]) for line in result.stdout.splitlines()]

    # Head and row choices are read: one head, the other head and the shifted rows align differently.
    one, other, shifted = links("--heads", "1"), links("--heads", "2"), links("--shift", "--method", "argmax")
    plain = links("--method", "argmax")
    assert len(one) == len(other) == len(shifted) == TOY_TEST
    assert one != other and shifted != plain
    # Links between pieces, words linked if any of their pieces are: each word link has a piece link, so
    # with argmax every target word keeps at least one link.
    by_pieces = links("--words", "any", "--method", "argmax")
    targets = [len(line.split()) for line in lines(files["de"])]
    assert all({j for _, j in w} == set(range(n)) for w, n in zip(by_pieces, targets))
    assert by_pieces != plain
    # Symmetrized with a reverse model (an LSTM trained German to English): the intersection lies inside
    # the forward links and the union holds them.
    backward = ["--reverse", runs["reverse"], "--method", "argmax"]
    inter = links(*backward, "--symmetrize", "intersection")
    union = links(*backward, "--symmetrize", "union")
    grown = links(*backward)  # grow-diag-final-and
    for f, i, u, g in zip(plain, inter, union, grown):
        assert i <= f <= u and i <= g <= u
    assert any(i != u for i, u in zip(inter, union))
    scored = invoke("align", runs["transformer"], *common, "--gold", files["align"], *backward, "--json")
    assert json.loads(scored.stdout)["symmetrize"] == "grow-diag-final-and"
    # A run folder that names its reverse model (reverse.json, as the bootstrap writes) aligns both ways.
    from attnmt.insight.links import write_reverse

    named = tmp_path / "named"
    shutil.copytree(runs["transformer"], named, ignore=shutil.ignore_patterns("*.lock"))
    write_reverse(named, runs["reverse"])
    both = invoke("align", named, *common, "--method", "argmax")
    assert both.exit_code == 0 and "aligning both ways" in both.stderr
    assert [set(parse_pharaoh(line)[0]) for line in both.stdout.splitlines()] == grown
    one_way = invoke("align", named, *common, "--method", "argmax", "--one-way")
    assert [set(parse_pharaoh(line)[0]) for line in one_way.stdout.splitlines()] == plain
    write_reverse(named, tmp_path / "gone")  # a reverse model that is not there: one way, said
    missing = invoke("align", named, *common, "--method", "argmax")
    assert missing.exit_code == 0 and "which is not there: aligning one way" in missing.stderr
    (named / "reverse.json").write_text("[1]", encoding="utf-8")
    broken = invoke("align", named, *common)
    assert broken.exit_code != 0 and "not a reverse model record" in assert_one_error_line(broken.stderr)


def _page_data(path) -> list[dict]:
    """The sentences' JSON of an explorer page (``explorer.py``: a ``<script id="explorer-data">``)."""
    text = path.read_text(encoding="utf-8")
    marker = '<script id="explorer-data" type="application/json">'
    start = text.index(marker) + len(marker)
    return json.loads(text[start: text.index("</script>", start)])["sentences"]


def test_plot_html_writes_one_explorer_of_every_sentence_with_the_alignment_align_gives(toy, tmp_path):
    runs, files = toy
    page = tmp_path / "attention.html"
    result = invoke("plot", runs["transformer"], "--input", files["en"], "--tgt", files["de"], "--gold",
                    files["align"], "--html", page, "--self", "--limit", 20)
    assert result.exit_code == 0, result.output
    assert f"wrote {page}" in result.stdout and "20 sentence(s)" in result.stdout
    data = _page_data(page)
    assert [s["number"] for s in data] == list(range(1, 21))
    assert set(data[0]["maps"]) == {"cross", "enc_self", "dec_self"}
    assert data[0]["maps"]["cross"]["layers"] == 2 and data[0]["maps"]["cross"]["heads"] == 2
    # The drawn links are align's, and each sentence's AER is its own score against the gold.
    aligned = invoke("align", runs["transformer"], "--src", files["en"], "--tgt", files["de"])
    expected = [sorted(parse_pharaoh(line)[0]) for line in aligned.stdout.splitlines()[:20]]
    assert [sorted(map(tuple, s["links"])) for s in data] == expected
    gold = [parse_pharaoh(line) for line in lines(files["align"])[:20]]
    for entry, (sure, possible), links in zip(data, gold, expected):
        assert entry["aer"] == pytest.approx(alignment_scores([links], [sure], [possible]).aer)
    # Without --tgt the model's own translations are read; the LSTM has cross-attention only.
    own = tmp_path / "own.html"
    result = invoke("plot", runs["lstm"], "may 1st 2001", "the 3rd of june 1990", "--html", own)
    assert result.exit_code == 0, result.output
    data = _page_data(own)
    assert len(data) == 2 and set(data[0]["maps"]) == {"cross"} and data[0]["aer"] is None


# ------------------------------------------------------------------------------------- calibration


def _planted(translator, sources, targets, gold_lines, layers: int, heads: int, plant: tuple[int, int]):
    """Cross-attention per pair, set by hand: head ``plant`` (layer, head) attends from each target piece
    to the source pieces of the words gold links its word to; every other head attends to the mirrored
    position with weight 0.9 (wrong, and wrong in their averages too)."""
    from attnmt.data.words import membership_of
    from attnmt.insight.reading import word_pieces as _word_pieces

    src_ids, src_groups, tgt_ids, tgt_groups = _word_pieces(translator, sources, targets, None)
    out = []
    for i, line in enumerate(gold_lines):
        S, T = len(src_ids[i]) + 1, len(tgt_ids[i]) + 1
        src_words, tgt_words = membership_of(src_groups[i], S - 1), membership_of(tgt_groups[i], T - 1)
        right = np.full((T, S), 1e-3)
        for a, b in parse_pharaoh(line)[0]:
            right[:-1, :-1] += np.outer(tgt_words[:, b] > 0, src_words[:, a] > 0)
        wrong = np.full((T, S), 0.1 / S)
        wrong[np.arange(T), (S - 1 - np.arange(T) * S // T).clip(0, S - 1)] += 0.9
        maps = [np.stack([wrong] * heads) for _ in range(layers)]
        maps[plant[0]][plant[1]] = right
        out.append([m / m.sum(-1, keepdims=True) for m in maps])
    return out


def test_calibrate_finds_the_planted_head_and_align_reads_it_by_default(toy, tmp_path, monkeypatch):
    import attnmt.insight.reading

    runs, files = toy
    run = tmp_path / "run"
    shutil.copytree(runs["transformer"], run)
    gold_lines = lines(files["align"])[:30]
    for name in ("en", "de", "align"):
        text = "".join(x + "\n" for x in lines(files[name])[:30])
        (tmp_path / f"dev.{name}").write_text(text, encoding="utf-8")
    original = attnmt.insight.reading._cross

    def planted(translator, src_ids, tgt_ids, *args, **kwargs):
        sources, targets = lines(files["en"])[:30], lines(files["de"])[:30]
        if len(src_ids) == 30:
            return _planted(translator, sources, targets, gold_lines, 2, 2, (1, 1))
        return original(translator, src_ids, tgt_ids, *args, **kwargs)

    monkeypatch.setattr(attnmt.insight.reading, "_cross", planted)
    dev = ["--src", tmp_path / "dev.en", "--tgt", tmp_path / "dev.de"]
    result = invoke("align", run, *dev, "--calibrate", tmp_path / "dev.align")
    assert result.exit_code == 0, result.output
    assert "chose layer / heads 2 / 2 (AER 0.0000 on 30 pairs" in result.stdout
    stored = json.loads((run / "alignment.json").read_text(encoding="utf-8"))
    assert stored["layer"] == 1 and stored["heads"] == [1] and stored["aer"] == 0.0
    scored = invoke("align", run, *dev, "--gold", tmp_path / "dev.align", "--json")
    assert scored.exit_code == 0, scored.output
    score = json.loads(scored.stdout)
    assert (score["layer"], score["heads"], score["aer"]) == ("2", "2", 0.0)
    every = invoke("align", run, *dev, "--gold", tmp_path / "dev.align", "--layer", "avg", "--heads", "all",
                   "--json")  # flags still win over the stored reading
    assert json.loads(every.stdout)["aer"] > 0.3
    # A stored reading that is not one is refused with its file named.
    (run / "alignment.json").write_text('{"layer": "two", "heads": null}', encoding="utf-8")
    broken = invoke("align", run, *dev)
    assert broken.exit_code == 3
    assert "alignment.json: layer must be null" in assert_one_error_line(broken.stderr)


# ------------------------------------------------------------------------------------- attribution


def test_attribute_writes_shares_per_target_piece_and_the_page_shows_them(toy, tmp_path):
    runs, files = toy
    out = tmp_path / "attr.jsonl"
    result = invoke("attribute", runs["transformer"], "--src", files["en"], "--tgt", files["de"],
                    "--method", "integrated_gradients", "--steps", 16, "--limit", 3, "-o", out)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["number"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["method"] == "integrated_gradients" and r["src"][-1] == r["tgt"][-1] == "</s>"
        assert r["tgt_in"] == ["<s>"] + r["tgt"][:-1]
        source, prefix = np.array(r["source"]), np.array(r["prefix"])
        assert source.shape == (len(r["tgt"]), len(r["src"])) and prefix.shape == (len(r["tgt"]),) * 2
        np.testing.assert_allclose(source.sum(1) + prefix.sum(1), 1.0, atol=1e-5)
        assert not np.triu(prefix, 1).any() and len(r["delta"]) == len(r["gap"]) == len(r["tgt"])
    # The attention method is the cross-attention averaged: its rows are all source, nothing to the prefix.
    result = invoke("attribute", runs["lstm"], "--src", files["en"], "--method", "attention", "--limit", 2)
    assert result.exit_code == 0, result.output
    attention = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(attention) == 2 and not np.array(attention[0]["prefix"]).any()
    np.testing.assert_allclose(np.array(attention[0]["source"]).sum(1), 1.0, atol=1e-5)
    # The page: attention and attribution side by side, the attribution's shares as one head.
    page = tmp_path / "attr.html"
    result = invoke("attribute", runs["transformer"], "--src", files["en"], "--tgt", files["de"],
                    "--method", "saliency", "--limit", 4, "--html", page)
    assert result.exit_code == 0, result.output
    assert f"wrote {page}" in result.stdout and "4 sentence(s)" in result.stdout
    data = _page_data(page)
    assert set(data[0]["maps"]) == {"cross", "attribution", "attribution_prefix"}
    assert data[0]["maps"]["attribution"]["heads"] == 1
    assert data[0]["maps"]["attribution_prefix"]["cols"] == len(data[0]["tgt_in"])


def test_alti_writes_distributions_and_the_page_draws_them_with_the_source_share(toy, tmp_path):
    runs, files = toy
    pair = ("--src", files["en"], "--tgt", files["de"])
    result = invoke("attribute", runs["transformer"], *pair, "--method", "alti", "--limit", 3)
    assert result.exit_code == 0, result.output
    for r in map(json.loads, result.stdout.splitlines()):
        source, prefix = np.array(r["source"]), np.array(r["prefix"])
        assert r["method"] == "alti" and (source >= 0).all() and (prefix >= 0).all()
        np.testing.assert_allclose(source.sum(1) + prefix.sum(1), 1.0, atol=1e-5)
        np.testing.assert_allclose(r["source_share"], source.sum(1), atol=1e-5)
        assert not np.triu(prefix, 1).any()
    page = tmp_path / "alti.html"
    assert invoke("attribute", runs["transformer"], *pair, "--method", "alti", "--limit", 2,
                  "--html", page).exit_code == 0
    data = _page_data(page)
    assert set(data[0]["maps"]) == {"cross", "alti", "alti_prefix"}
    assert list(data[0]["shares"]) == ["alti"] and len(data[0]["shares"]["alti"]) == len(data[0]["tgt"])
    # rollout and flow: the page's other views of what a prediction owes its inputs
    page = tmp_path / "rollout.html"
    result = invoke("plot", runs["transformer"], "--input", files["en"], "--tgt", files["de"], "--html", page,
                    "--rollout", "--flow", "--limit", 1)
    assert result.exit_code == 0, result.output
    data = _page_data(page)
    assert set(data[0]["maps"]) == {"cross", "rollout", "rollout_prefix", "flow", "flow_prefix"}
    assert set(data[0]["shares"]) == {"rollout", "flow"}
    refused = invoke("plot", runs["lstm"], "a", "--html", tmp_path / "x.html", "--rollout")
    assert refused.exit_code == 2 and "--rollout: a lstm model" in assert_one_error_line(refused.stderr)


def test_alti_links_align_about_as_well_as_attention(toy):
    """Links read off ALTI+'s source shares within 2 points of AER of the cross-attention's (every layer
    and head averaged) on the fixture's briefly trained model. The issue's goal on the trained toy recipe
    is measured in docs/tutorials/looking-inside.md (9.24% against 4.62%: missed there)."""
    runs, files = toy
    pair = ("--src", files["en"], "--tgt", files["de"], "--gold", files["align"], "--json")
    alti = json.loads(invoke("align", runs["transformer"], *pair, "--from", "alti").stdout)
    attention = json.loads(invoke("align", runs["transformer"], *pair).stdout)
    print(f"toy AER: ALTI+ {alti['aer']:.4f}, attention {attention['aer']:.4f}")
    assert alti["from"] == "alti" and alti["sentences"] == TOY_TEST
    assert alti["aer"] <= attention["aer"] + 0.02


def test_align_from_a_gradient_attribution_beats_the_diagonal(toy, tmp_path):
    runs, toy_files = toy
    files = {}
    for name, path in toy_files.items():
        files[name] = tmp_path / path.name
        files[name].write_text("".join(x + "\n" for x in lines(path)[:GRADIENT_PAIRS]), encoding="utf-8")
    result = invoke("align", runs["lstm"], "--src", files["en"], "--tgt", files["de"],
                    "--gold", files["align"], "--from", "input_x_gradient", "--json")
    assert result.exit_code == 0, result.output
    score = json.loads(result.stdout)
    assert score["from"] == "input_x_gradient" and score["sentences"] == GRADIENT_PAIRS
    baseline = diagonal_aer(files)
    print(f"toy AER: LSTM input x gradient {score['aer']:.3f}, diagonal baseline {baseline:.3f}")
    assert score["aer"] < baseline - 0.05


def test_without_captum_attribution_says_how_to_install_it(toy, monkeypatch):
    runs, files = toy
    monkeypatch.setitem(sys.modules, "captum", None)  # import captum raises ImportError
    for args in (["attribute", runs["lstm"], "--src", files["en"]],
                 ["align", runs["lstm"], "--src", files["en"], "--from", "saliency"]):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "pip install 'attnmt[attribute]'" in assert_one_error_line(result.stderr)
    assert invoke("attribute", runs["lstm"], "--src", files["en"], "--method", "attention",
                  "--limit", 1).exit_code == 0  # attention needs no captum
    assert invoke("attribute", runs["transformer"], "--src", files["en"], "--method", "alti",
                  "--limit", 1).exit_code == 0  # nor does ALTI+
    refused = invoke("attribute", runs["lstm"], "--src", files["en"], "--method", "alti", "--limit", 1)
    assert refused.exit_code == 2 and "ALTI+ reads a Transformer" in assert_one_error_line(refused.stderr)


# ------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "case, code, needle",
    [
        ("fewer_targets", 3, "has 100 lines"),
        ("bad_gold", 3, "malformed alignment link"),
        ("gold_out_of_range", 3, "outside the pair"),
        ("missing_source", 3, "file not found"),
        ("gold_without_target", 2, "--gold needs --tgt"),
        ("layer_too_deep", 2, "--layer 3"),
        ("unknown_method", 2, "--method"),
        ("heads_too_many", 2, "--heads 1,3: the model has 2"),
        ("heads_zero", 2, "heads count from 1"),
        ("reverse_missing", 4, "nope.pt"),
        ("reverse_layer_too_deep", 2, "the --reverse model has 1"),
        ("reverse_same_direction", 2, "it translates en->de, but the reverse of"),
        ("symmetrize_without_reverse", 2, "--symmetrize combines two directions"),
        ("corrupt_checkpoint", 4, "corrupt or unsafe checkpoint"),
        ("plot_format", 2, "--format"),
        ("plot_self_lstm", 2, "no self-attention"),
        ("curves_without_metrics", 3, "metrics.jsonl"),
        ("plot_out_and_html", 2, "give --out FOLDER (figures) or --html FILE"),
        ("plot_neither", 2, "give --out FOLDER (figures) or --html FILE"),
        ("plot_gold_without_tgt", 2, "--gold needs --tgt"),
        ("plot_tgt_without_html", 2, "--tgt is read with --html only"),
        ("plot_html_short_tgt", 3, "has 99 lines, but there are 100 sources"),
        ("plot_html_bad_gold", 3, "malformed alignment link"),
        ("plot_html_layer", 2, "--layer: the --html page holds every layer"),
        ("calibrate_without_tgt", 2, "--calibrate needs --tgt"),
        ("calibrate_with_layer", 2, "it cannot be used with --layer"),
        ("calibrate_checkpoint_file", 2, "is not in one"),
        ("attribute_unknown_method", 2, "--method"),
        ("attribute_one_step", 2, "--steps"),
        ("attribute_short_tgt", 3, "has 99"),
        ("align_from_with_layer", 2, "--layer chooses what attention is read; --from saliency"),
        ("align_from_with_shift", 2, "--shift chooses what attention is read"),
    ],
)
def test_bad_inputs_exit_with_one_error_line(toy, tmp_path, case, code, needle):
    runs, files = toy
    lstm, en, de = runs["lstm"], files["en"], files["de"]
    short = tmp_path / "short.de"
    short.write_text("".join(line + "\n" for line in lines(de)[:99]), encoding="utf-8")
    gold = tmp_path / "gold.align"
    corrupt = tmp_path / "model.pt"
    corrupt.write_bytes(b"\x00not a checkpoint" * 10)
    loose = tmp_path / "loose.pt"  # a checkpoint outside a run folder
    if case == "calibrate_checkpoint_file":
        shutil.copy(next((lstm / "checkpoints").glob("step_*.pt")), loose)
    args = {
        "fewer_targets": ["align", lstm, "--src", en, "--tgt", short],
        "bad_gold": ["align", lstm, "--src", en, "--tgt", de, "--gold", gold],
        "gold_out_of_range": ["align", lstm, "--src", en, "--tgt", de, "--gold", gold],
        "missing_source": ["align", lstm, "--src", tmp_path / "nope.en"],
        "gold_without_target": ["align", lstm, "--src", en, "--gold", files["align"]],
        "layer_too_deep": ["align", runs["transformer"], "--src", en, "--layer", 3],
        "unknown_method": ["align", lstm, "--src", en, "--method", "intersect"],
        "corrupt_checkpoint": ["align", corrupt, "--src", en],
        "heads_too_many": ["align", runs["transformer"], "--src", en, "--heads", "1,3"],
        "heads_zero": ["align", runs["transformer"], "--src", en, "--heads", "0"],
        "reverse_missing": ["align", lstm, "--src", en, "--tgt", de, "--reverse", tmp_path / "nope.pt"],
        "reverse_layer_too_deep": ["align", runs["transformer"], "--src", en, "--tgt", de, "--layer", 2,
                                   "--reverse", runs["reverse"]],
        "reverse_same_direction": ["align", runs["transformer"], "--src", en, "--tgt", de, "--reverse", lstm],
        "symmetrize_without_reverse": ["align", lstm, "--src", en, "--tgt", de, "--symmetrize", "union"],
        "plot_format": ["plot", lstm, "may 1st 2001", "--out", tmp_path / "maps", "--format", "gif"],
        "plot_self_lstm": ["plot", lstm, "may 1st 2001", "--out", tmp_path / "maps", "--self"],
        "curves_without_metrics": ["plot-curves", tmp_path],
        "plot_out_and_html": ["plot", lstm, "may 1st 2001", "--out", tmp_path / "maps", "--html",
                              tmp_path / "maps.html"],
        "plot_neither": ["plot", lstm, "may 1st 2001"],
        "plot_gold_without_tgt": ["plot", lstm, "--input", en, "--gold", files["align"], "--html",
                                  tmp_path / "maps.html"],
        "plot_tgt_without_html": ["plot", lstm, "--input", en, "--tgt", de, "--out", tmp_path / "maps"],
        "plot_html_short_tgt": ["plot", lstm, "--input", en, "--tgt", short, "--html",
                                tmp_path / "maps.html"],
        "plot_html_layer": ["plot", lstm, "may 1st 2001", "--layer", 1, "--html", tmp_path / "maps.html"],
        "calibrate_without_tgt": ["align", lstm, "--src", en, "--calibrate", files["align"]],
        "calibrate_with_layer": ["align", lstm, "--src", en, "--tgt", de, "--calibrate", files["align"],
                                 "--layer", 1],
        "calibrate_checkpoint_file": ["align", loose, "--src", en, "--tgt", de, "--calibrate",
                                      files["align"]],
        "attribute_unknown_method": ["attribute", lstm, "--src", en, "--method", "lime", "-o",
                                     tmp_path / "maps"],
        "attribute_one_step": ["attribute", lstm, "--src", en, "--steps", 1, "--html",
                               tmp_path / "maps.html"],
        "attribute_short_tgt": ["attribute", lstm, "--src", en, "--tgt", short, "--html",
                                tmp_path / "maps.html"],
        "align_from_with_layer": ["align", lstm, "--src", en, "--from", "saliency", "--layer", 1, "-o",
                                  tmp_path / "maps"],
        "align_from_with_shift": ["align", lstm, "--src", en, "--from", "input_x_gradient", "--shift"],
        "plot_html_bad_gold": ["plot", lstm, "--input", en, "--tgt", de, "--gold", gold, "--html",
                               tmp_path / "maps.html"],
    }[case]
    gold_lines = lines(files["align"])
    broken = {"bad_gold": "0-1 2x3", "gold_out_of_range": "0-1 0-99"}
    gold_lines[1] = broken.get(case.removeprefix("plot_html_"), gold_lines[1])
    gold.write_text("".join(line + "\n" for line in gold_lines), encoding="utf-8")
    result = invoke(*args)
    assert result.exit_code == code, result.output
    line = assert_one_error_line(result.stderr)
    assert needle in line
    if case == "fewer_targets":
        assert "has 99" in line
    if case in ("bad_gold", "gold_out_of_range", "plot_html_bad_gold"):
        assert f"{gold}:2:" in line
    assert not (tmp_path / "maps").exists() and not (tmp_path / "maps.html").exists()

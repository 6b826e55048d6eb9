"""Guided alignment training (``train.alignment``): the alignment file checked against the corpus (bad
files exit 3 with one line naming file and line), word links turned into piece links (an oracle by hand),
the config checks, and the toy recipe: a guided model aligns better than the same model unguided, and its
validation records the dev AER.

Commands run in-process (``CliRunner``) on small models, to keep the module fast.
"""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import assert_one_error_line, read_records
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import GuidedAlignmentConfig
from attnmt.data.batching import EncodedSplit
from attnmt.errors import DataError
from attnmt.training.guided import piece_alignments


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


class _Pieces:
    """A stand-in tokenizer: ids are indices into a fixed piece list."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def src_pieces(self, ids):
        return [self.pieces[i] for i in ids]

    tgt_pieces = src_pieces


def test_word_links_become_every_pair_of_their_pieces():
    pieces = ["▁the", "▁bi", "cycle", "▁das", "▁fahr", "rad", "▁!"]
    tok = _Pieces(pieces)
    # Source "the bicycle" (pieces 0 | 1 2), target "das fahrrad !" (pieces 3 | 4 5 | 6).
    split = EncodedSplit.from_lists([[0, 1, 2]], [[3, 4, 5, 6]], ["das fahrrad !"], lines=[1], gold=None)
    guided = GuidedAlignmentConfig(path=None)
    split.gold = ["0-0 1-1 1?2"]  # the toy's own alignments, when path is None (possible links not taught)
    (links,) = piece_alignments(guided, split, tok, 1, "toy").links
    # (target piece, source piece): das <- the; fahr, rad <- bi, cycle; "!" unlinked.
    assert links.tolist() == [[0, 0], [1, 1], [1, 2], [2, 1], [2, 2]]


def test_chinese_characters_are_words_and_a_two_character_piece_belongs_to_both():
    tok = _Pieces(["▁猫", "喜欢", "鱼", "▁cats", "▁like", "▁fish"])
    # Source 猫喜欢鱼: characters 猫 | 喜 | 欢 | 鱼 are words 0..3; "喜欢" is one piece of words 1 and 2.
    split = EncodedSplit.from_lists([[0, 1, 2]], [[3, 4, 5]], ["cats like fish"], lines=[1],
                                    gold=["0-0 1-1 2-1 3-2"])
    (links,) = piece_alignments(GuidedAlignmentConfig(), split, tok, 1, "toy").links
    assert links.tolist() == [[0, 0], [1, 1], [2, 2]]
    split.gold = ["4-0"]
    with pytest.raises(DataError, match=r"toy task's alignments:1: link 4-0 is outside the pair \(4 source"):
        piece_alignments(GuidedAlignmentConfig(), split, tok, 1, "toy")


def test_an_alignment_file_follows_the_corpus_as_read(tmp_path):
    """Pairs dropped by cleaning keep their line: kept pair k takes the line it was read from."""
    tok = _Pieces(["▁a", "▁b", "▁x", "▁y"])
    path = tmp_path / "train.align"
    path.write_text("0-0\n9-9\n0-0 1-1\n", encoding="utf-8")  # line 2's pair was dropped (empty)
    split = EncodedSplit.from_lists([[0], [0, 1]], [[2], [2, 3]], ["x", "x y"], lines=[1, 3])
    guided = GuidedAlignmentConfig(path=path)
    first, second = piece_alignments(guided, split, tok, 3, "train.en/train.de").links
    assert first.tolist() == [[0, 0]] and second.tolist() == [[0, 0], [1, 1]]
    with pytest.raises(DataError, match=r"train.align: 3 lines, but the training corpus \(c\) has 4"):
        piece_alignments(guided, split, tok, 4, "c")
    # A pair whose pieces make other words than its spaces (here "x y" read as one piece) is left out.
    split.src_text = ["a", "a b"]
    split.tgt_text = ["x", "x y z"]
    found = piece_alignments(guided, split, tok, 3, "c")
    assert found.links[1].shape == (0, 2) and (found.skipped, found.first_skipped) == (1, 3)
    one_based = GuidedAlignmentConfig(path=path, one_based=True)
    with pytest.raises(DataError, match="index 0, but indices are one-based"):
        piece_alignments(one_based, split, tok, 3, "c")


# ------------------------------------------------------------------------------------------ the CLI

TINY = {
    "data": {"src_lang": "en", "tgt_lang": "de", "train": {"format": "toy", "split": "train", "size": 2000},
             "dev": {"format": "toy", "split": "dev", "size": 40}},
    "tokenizer": {"vocab_size": 100},
    "model": {"arch": "transformer", "d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 2,
              "d_ff": 64, "dropout": 0.0},
    "train": {"device": "cpu", "lr": 5.0e-3, "schedule": "constant", "warmup_steps": 0, "max_tokens": 1024,
              "max_steps": 300, "eval_every": 150, "save_every": 300, "log_every": 50, "precision": "fp32"},
    "decode": {"beam_size": 1},
}  # fmt: skip
GUIDED = {"layer": 1, "heads": [1], "weight": 0.5}


def _config(tmp_path, name: str, **train) -> object:
    config = tmp_path / f"{name}.yaml"
    config.write_text(json.dumps({**TINY, "train": {**TINY["train"], **train}}), encoding="utf-8")
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two runs of one small toy Transformer, unguided and guided, and the toy test files."""
    root = tmp_path_factory.mktemp("guided")
    runs = {}
    for name, extra in (("plain", {}), ("guided", {"alignment": GUIDED}),
                        ("full", {"alignment": {**GUIDED, "full_context": True}})):
        run = root / name
        if runs:  # same data and tokenizer: reuse the prepared data
            first = runs["plain"]
            for part in ("data", "tokenizer"):
                shutil.copytree(first / part, run / part)
            shutil.copy(first / "config.yaml", run / "config.yaml")
        result = invoke("train", _config(root, name, **extra), "--run-dir", run)
        assert result.exit_code == 0, result.output
        runs[name] = run
    data = root / "toy"
    assert invoke("toy-data", data, "--train-size", 1, "--dev-size", 1, "--test-size", 200).exit_code == 0
    return runs, data


def test_guided_training_aligns_better_than_unguided_and_records_dev_aer(trained):
    runs, data = trained
    scores = {}
    for name, run in runs.items():
        if name == "full":
            continue
        result = invoke("align", run, "--src", data / "test.en", "--tgt", data / "test.de",
                        "--gold", data / "test.align", "--json")
        assert result.exit_code == 0, result.output
        scores[name] = json.loads(result.stdout)
    print({name: round(s["aer"], 4) for name, s in scores.items()})
    # align reads the guided model's taught layer and head by default, every layer and head otherwise.
    assert (scores["guided"]["layer"], scores["guided"]["heads"]) == ("1", "1")
    assert (scores["plain"]["layer"], scores["plain"]["heads"]) == ("avg", "all")
    assert scores["guided"]["aer"] < min(scores["plain"]["aer"] / 2, 0.03)
    # Validation scores the dev AER (the toy task has gold), and the guided loss is logged and falls.
    for run in (runs["plain"], runs["guided"]):
        valid = read_records(run, "valid")
        assert [r["step"] for r in valid] == [150, 300] and all(0 <= r["aer"] <= 1 for r in valid)
    assert valid[-1]["aer"] == pytest.approx(_dev_aer(runs["guided"]), abs=1e-6)
    logged = [r["align_loss"] for r in read_records(runs["guided"], "train")]
    assert logged[-1] < logged[0]
    assert all(r["align_loss"] is None for r in read_records(runs["plain"], "train"))


def test_a_head_taught_in_the_full_context_pass_is_read_in_it(trained):
    """On the toy task, a head taught where every target piece sees the whole target aligns as well as the
    causally taught one, read so (align's default for it); ``--causal`` reads the other pass (on this
    monotone task the taught head happens to align there too)."""
    runs, data = trained
    pair = ("--src", data / "test.en", "--tgt", data / "test.de", "--gold", data / "test.align", "--json")
    full = json.loads(invoke("align", runs["full"], *pair).stdout)
    causal_reading = json.loads(invoke("align", runs["full"], *pair, "--causal").stdout)
    print(round(full["aer"], 4), round(causal_reading["aer"], 4))
    assert full["full_context"] is True and causal_reading["full_context"] is False
    assert full["aer"] < 0.03 and causal_reading["aer"] != full["aer"]
    refused = invoke("align", runs["full"], *pair, "--full-context", "--from", "alti")
    assert refused.exit_code == 2 and "--full-context chooses" in assert_one_error_line(refused.stderr)


def _dev_aer(run) -> float:
    """The dev AER of the final checkpoint, recomputed from the toy dev split through ``attnmt align``."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        assert invoke("toy-data", out, "--train-size", 1, "--dev-size", 40, "--test-size", 1).exit_code == 0
        result = invoke("align", run, "--src", out / "dev.en", "--tgt", out / "dev.de",
                        "--gold", out / "dev.align", "--json")
        return json.loads(result.stdout)["aer"]


@pytest.mark.parametrize(
    "case, code, needle",
    [
        ("too_few_lines", 3, "train.align: 19 lines, but the training corpus"),
        ("malformed", 3, "train.align:4: malformed alignment link '1x2'"),
        ("out_of_range", 3, "train.align:7: link 0-40 is outside the pair"),
        ("missing_file", 3, "nope.align"),
        ("layer_too_deep", 2, "train.alignment.layer: 3, but the model has 2"),
        ("head_too_many", 2, "train.alignment.heads: [3], but the model has 2"),
        ("no_path_for_a_real_corpus", 2, "train.alignment: path is required"),
        ("zero_weight", 2, "train.alignment.weight"),
        ("full_context_lstm", 2, "train.alignment.full_context: full-context alignment needs model.arch"),
    ],
)
def test_bad_alignment_inputs_exit_with_one_error_line(tmp_path, case, code, needle):
    src, tgt, align = tmp_path / "train.en", tmp_path / "train.de", tmp_path / "train.align"
    src.write_text("".join(f"a b c {i}\n" for i in range(20)), encoding="utf-8")
    tgt.write_text("".join(f"x y {i}\n" for i in range(20)), encoding="utf-8")
    lines = ["0-0 1-1 3-2"] * 20
    if case == "too_few_lines":
        lines = lines[:19]
    elif case == "malformed":
        lines[3] = "0-0 1x2"
    elif case == "out_of_range":
        lines[6] = "0-40"
    align.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    guided = {"path": str(tmp_path / "nope.align") if case == "missing_file" else str(align)}
    guided |= {"layer_too_deep": {"layer": 3}, "head_too_many": {"heads": [3]},
               "zero_weight": {"weight": 0.0}, "full_context_lstm": {"full_context": True}}.get(case, {})
    if case == "no_path_for_a_real_corpus":
        guided = {"layer": 1}
    data = {"src_lang": "en", "tgt_lang": "de", "train": {"src": str(src), "tgt": str(tgt)}}
    model = {"arch": "lstm", "emb_dim": 8, "hidden_size": 8} if case == "full_context_lstm" else TINY["model"]
    config = {**TINY, "data": data, "model": model,
              "tokenizer": {"vocab_size": 20, "hard_vocab_limit": False},
              "train": {**TINY["train"], "max_steps": 1, "alignment": guided}}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = invoke("train", path, "--run-dir", tmp_path / "run")
    assert result.exit_code == code, result.output
    assert needle in assert_one_error_line(result.stderr)
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))

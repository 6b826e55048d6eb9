"""``attnmt translate --markup`` on small models trained once for this module, an LSTM and a Transformer:
the output is the plain translation with each source tag put back once, well-formed, around the target
words the toy task's gold alignment gives where it is clear (a weekday, a year); with beam search and
n-best lists, prefixes and constraints; a line without tags costs no alignment; a line that is not
well-formed is one error naming its line, exit 3, before anything is written."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from helpers import TOY_ALIGN_BASE, expect_error
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.data.markup import parse_markup
from attnmt.data.words import segment

BASE = TOY_ALIGN_BASE
MODELS = {
    "lstm": ({"arch": "lstm", "emb_dim": 32, "hidden_size": 32, "attn_dim": 32, "enc_layers": 1,
              "dec_layers": 1, "dropout": 0.0}, {}),
    # tests/training/test_alignment_layer.py's Transformer without dropout: dev BLEU 88 at step 300
    "transformer": ({"arch": "transformer", "d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 2,
                     "d_ff": 64, "dropout": 0.0},
                    {"lr": 5.0e-3, "max_steps": 300, "eval_every": 300, "save_every": 300, "clip_norm": 0.5}),
}  # fmt: skip
SENTENCE = "<b>tuesday</b> , march 14th , <u>2019</u> at <i>7:05 pm</i><br/>"
# The words the gold alignment gives the tags above (attnmt/data/toy.py): the weekday's, the year's, and
# the time's with "uhr" (pm's; the hour as the model wrote it); the line break after them.
RIGHT = {"<b>": ["dienstag"], "<u>": ["2019"], "<br/>": []}


def invoke(*args, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


class Runs:
    """Run folders trained on first use, one per architecture, sharing one prepared toy corpus."""

    def __init__(self, root) -> None:
        self.root, self.trained = root, {}

    def __getitem__(self, arch: str):
        if arch not in self.trained:
            config, run = self.root / f"{arch}.json", self.root / arch
            model, train = MODELS[arch]
            config.write_text(json.dumps({**BASE, "model": model, "train": {**BASE["train"], **train}}),
                              encoding="utf-8")
            if self.trained:  # same data and tokenizer settings: reuse the prepared data
                first = next(iter(self.trained.values()))
                for part in ("data", "tokenizer"):
                    shutil.copytree(first / part, run / part)
                shutil.copy(first / "config.yaml", run / "config.yaml")
            result = invoke("train", config, "--run-dir", run)
            assert result.exit_code == 0, result.output
            self.trained[arch] = run
        return self.trained[arch]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("markup"))


def translate(run, *args, input: str | None = None) -> list[str]:
    result = invoke("translate", run, *args, input=input)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def check_markup(source: str, out: str, plain: str) -> dict[str, list[str]]:
    """``out`` is well-formed, its text is ``plain`` (the translation without --markup) and it holds each
    tag of ``source`` exactly once; returns each tag's wrapped target words (by its start tag)."""
    ET.fromstring(f"<root>{out}</root>")
    marked, got = parse_markup(source), parse_markup(out)
    assert got.text == plain, (out, plain)
    assert sorted(t.open_text for t in got.tags) == sorted(t.open_text for t in marked.tags), out
    words = [w.text for w in segment(got.text)]
    return {t.open_text: words[t.start:t.end] for t in got.tags}


@pytest.mark.parametrize("arch", MODELS)
def test_tags_come_back_on_the_aligned_words(runs, arch):
    plain = parse_markup(SENTENCE).text
    (expected,) = translate(runs[arch], plain)
    (out,) = translate(runs[arch], "--markup", SENTENCE)
    wrapped = check_markup(SENTENCE, out, expected)
    assert {tag: wrapped[tag] for tag in RIGHT} == RIGHT, out
    assert expected.split()[-3::2] == ["um", "uhr"] and wrapped["<i>"] == expected.split()[-2:], out
    assert out.endswith("<br/>"), out  # after the last word, as in the source


@pytest.mark.parametrize("arch", MODELS)
def test_every_hypothesis_of_an_nbest_list_gets_its_tags(runs, arch):
    plain = parse_markup(SENTENCE).text
    expected = translate(runs[arch], plain, "--nbest", 3, "--beam-size", 3)
    got = translate(runs[arch], "--markup", SENTENCE, "--nbest", 3, "--beam-size", 3)
    assert len(got) == len(expected) == 3
    for line, plain_line in zip(got, expected):
        index, score, out = line.split("\t")
        plain_index, plain_score, plain_text = plain_line.split("\t")
        assert (index, score) == (plain_index, plain_score)
        # the weekday (first in both languages) keeps its tag, whatever the hypothesis made of it
        assert check_markup(SENTENCE, out, plain_text)["<b>"] == plain_text.split()[:1], line


def test_prefixes_and_constraints_are_kept_and_tagged(runs, tmp_path):
    run = runs["lstm"]
    source = tmp_path / "in.en"
    source.write_text(SENTENCE + "\n" + "<b>friday</b> the 1st of may 2001\n", encoding="utf-8")
    prefix, phrases = tmp_path / "prefix.de", tmp_path / "phrases.de"
    prefix.write_text("dienstag , 14.\n\n", encoding="utf-8")
    phrases.write_text("\nmai\n", encoding="utf-8")
    plain = tmp_path / "plain.en"
    plain.write_text("".join(parse_markup(line).text + "\n" for line in source.read_text().splitlines()))
    options = ("--prefix", prefix, "--constraints", phrases, "--beam-size", 3)
    expected = translate(run, "-i", plain, *options)
    got = translate(run, "-i", source, "--markup", *options)
    assert expected[0].startswith("dienstag , 14.") and "mai" in expected[1].split()
    for line, out, plain_text in zip(source.read_text().splitlines(), got, expected):
        check_markup(line, out, plain_text)


def test_a_line_without_tags_is_escaped_and_not_aligned(runs, monkeypatch):
    from attnmt.insight import reading

    def refuse(*args, **kwargs):
        raise AssertionError("a line without tags was aligned")

    monkeypatch.setattr(reading, "align_corpus", refuse)
    sources = ["tuesday , march 14th , 2019", "AT&amp;T", ""]
    assert translate(runs["lstm"], "--markup", "-i", "-", input="\n".join(sources) + "\n")[2] == ""
    (out,) = translate(runs["lstm"], "--markup", "AT&amp;T &lt;3")
    ET.fromstring(f"<root>{out}</root>")  # whatever came out of "AT&T <3" is escaped


@pytest.mark.parametrize("where", ["file", "stdin", "argument"])
def test_a_malformed_line_is_one_error_naming_it_before_any_output(runs, tmp_path, where):
    """Arguments and a file are checked whole before any work; a stream line by line, as it arrives (to
    stdout, the lines before the malformed one come out first; -o writes nothing)."""
    lines = [SENTENCE, "<b>friday</b> the <i>1st of may 2001</b>", "may 1st 2001"]
    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = {"file": ["-i", source], "stdin": ["-i", "-", "-o", output], "argument": lines}[where]
    result = invoke("translate", runs["lstm"], "--markup", *args, input="\n".join(lines) + "\n")
    name = {"file": f"{source}:2", "stdin": "<stdin>:2", "argument": "sentence 2"}[where]
    expect_error(result, 3, f"{name}: column 37: </b> closes <i> (opened at column 19)")
    assert result.stdout == "" and not output.exists()

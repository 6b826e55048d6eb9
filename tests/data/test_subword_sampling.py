"""Subword regularisation (``tokenizer.sampling``, issue 27 item 5): the training pairs segmented anew at
every epoch by unigram sampling or BPE-dropout, never the dev or test split or decoding.

Oracles: the same (seed, epoch, example) gives the same pieces in any order, in a fresh sampler, and
across a resume (the resumed run's weights equal the uninterrupted run's bit for bit); another epoch or
seed gives other pieces; every sampled segmentation decodes to the cleaned sentence it came from (unigram
and BPE-dropout); a side too long for the model keeps its deterministic pieces; a micro-batch that outgrew
the budget is cut into parts within it; a spy on sentencepiece's sampling sees only training sentences
through a training run with validation, ``eval`` and ``translate``; bad settings are one error line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TOY_CONFIG, assert_one_error_line, hash_tree
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import SamplingConfig, load_config
from attnmt.data.batching import collate, load_split
from attnmt.data.bpe_dropout import is_bpe, model_spec
from attnmt.data.prepare import prepare
from attnmt.data.subword_sampling import SubwordSampler, TextLines, example_seed, longest_sampled
from attnmt.data.tokenizer import Tokenizer, load_tokenizer
from attnmt.errors import ConfigError, DataError
from attnmt.models.checkpoint import load_checkpoint, step_file
from attnmt.runfiles import RunDir
from attnmt.training import runstart

UNBOUNDED = 10**6


pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py


@pytest.fixture(scope="module")
def prepared(tiny):
    """The tiny run's training split (200 toy pairs, texts in src.txt/tgt.txt) and its unigram tokenizer."""
    run = RunDir(tiny.prepared)
    return load_split(run, "train"), load_tokenizer(run.tokenizer)


def sampler(prepared, alpha: float = 0.5, nbest: int = 32, seed: int = 1, longest: int = UNBOUNDED):
    split, tokenizer = prepared
    return SubwordSampler(tokenizer, split, SamplingConfig(alpha=alpha, nbest=nbest), seed, longest)


def every_pair(s: SubwordSampler, epoch: int, rows=None) -> list[tuple[list[int], list[int]]]:
    return [s.pair(i, epoch) for i in (range(len(s.split)) if rows is None else rows)]


# ------------------------------------------------------------------------------------ determinism


def test_the_pieces_are_a_pure_function_of_seed_epoch_and_example(prepared):
    first = sampler(prepared)
    forward = every_pair(first, 3)
    # Another sampler, the examples in reverse, other epochs' draws in between: the same pieces.
    second = sampler(prepared)
    backward = {}
    for i in reversed(range(len(second.split))):
        second.pair(i, 2)
        backward[i] = second.pair(i, 3)
    assert forward == [backward[i] for i in range(len(forward))]
    # The batch of any set of examples holds those pieces.
    rows = np.array([17, 3, 150, 42])
    (batch,) = first.batches(rows, 3, UNBOUNDED)
    expected = collate([forward[i][0] for i in rows], [forward[i][1] for i in rows], rows.tolist())
    for name in ("src", "tgt_in", "tgt_out", "src_lengths", "tgt_lengths", "indices"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name


def test_another_epoch_or_seed_draws_other_pieces(prepared):
    epoch3 = every_pair(sampler(prepared), 3)
    for other in (every_pair(sampler(prepared), 4), every_pair(sampler(prepared, seed=2), 3)):
        differ = sum(a != b for a, b in zip(epoch3, other))
        assert differ > len(epoch3) // 2, differ


def test_example_seeds_differ_by_side_epoch_and_index_and_fit_sentencepiece():
    seeds = {example_seed(1, e, i, side) for e in range(3) for i in range(200) for side in ("src", "tgt")}
    assert len(seeds) == 3 * 200 * 2
    assert all(0 <= s < 2**32 - 1 for s in seeds)  # 2**32 - 1 is sentencepiece's "no seed"


# ------------------------------------------------------------------------------ what is sampled


def test_sampled_pieces_decode_to_the_cleaned_sentence_and_vary(prepared):
    split, tokenizer = prepared
    s = SubwordSampler(tokenizer, split, SamplingConfig(alpha=0.3, nbest=32), 1, UNBOUNDED)
    pairs = every_pair(s, 0)
    changed = 0
    for i, (src, tgt) in enumerate(pairs):
        # joint tokenizers: one model decodes both sides
        assert tokenizer.decode_tgt([src, tgt]) == [split.src_text[i], split.tgt_text[i]]
        changed += (src, tgt) != (split.src_ids[i], split.tgt_ids[i])
    assert changed > len(pairs) // 2, changed
    # Deterministic encoding of the same texts is unaffected by the seeded sampling before it.
    assert tokenizer.encode_src(split.src_text[:20]) == [split.src_ids[i] for i in range(20)]


def test_the_draws_repeat_in_another_process(prepared, tmp_path):
    """sentencepiece's own sampling does not (one seed, other draws in each process): the n-best list is
    sentencepiece's, the draw numpy's, so a resumed run's pieces are the first run's."""
    import subprocess
    import sys

    split, tokenizer = prepared
    (tmp_path / "spm.model").write_bytes(tokenizer.src_model)
    code = ("import sys, json; from attnmt.data.tokenizer import Tokenizer\n"
            "m = open(sys.argv[1], 'rb').read(); t = Tokenizer(m, m, True)\n"
            "lines = sys.argv[2:]\n"
            "print(json.dumps([t.sample('src', line, 0.3, 16, 7 + k) for k, line in enumerate(lines)]))")
    lines = split.src_text[:30]
    here = [tokenizer.sample("src", line, 0.3, 16, 7 + k) for k, line in enumerate(lines)]
    there = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spm.model"), *lines],
                           capture_output=True, text=True, check=True)
    assert json.loads(there.stdout) == here
    assert len({tuple(ids) for ids in here}) > 1


def test_a_side_too_long_for_the_model_keeps_its_deterministic_pieces(prepared):
    split, _ = prepared
    free = every_pair(sampler(prepared), 0)
    longest = int(np.percentile([len(x) for pair in free for x in pair], 50))
    capped = every_pair(sampler(prepared, longest=longest), 0)
    kept = 0
    for i, (pair, unbounded) in enumerate(zip(capped, free)):
        deterministic_pair = (split.src_ids[i], split.tgt_ids[i])
        for side, ids, drawn, deterministic in zip("st", pair, unbounded, deterministic_pair):
            if len(drawn) > longest:
                assert ids == deterministic, (i, side)
                kept += 1
            else:
                assert ids == drawn, (i, side)
    assert kept > 0


def test_longest_sampled_is_max_len_within_the_transformers_positions():
    cfg = load_config(TOY_CONFIG, ["data.max_len=50", "model.max_positions=40"])
    assert longest_sampled(cfg) == 39  # the side's EOS (or BOS) takes a position too
    lstm = load_config(TOY_CONFIG.with_name("toy_lstm.yaml"), ["data.max_len=50"])
    assert longest_sampled(lstm) == 50


def test_a_micro_batch_that_outgrew_the_budget_is_cut_into_parts_within_it(prepared):
    s = sampler(prepared)
    rows = np.arange(0, 200, 3)
    budget = 120
    parts = s.batches(rows, 0, budget)
    assert len(parts) > 1
    seen = []
    for part in parts:
        cost = part.size * max(int(part.src_lengths.max()), int(part.tgt_lengths.max()))
        assert cost <= budget or part.size == 1
        seen += part.indices.tolist()
        for k, i in enumerate(part.indices.tolist()):
            src, tgt = s.pair(i, 0)
            assert part.src[k, : len(src)].tolist() == src and part.tgt_out[k, : len(tgt)].tolist() == tgt
    assert sorted(seen) == rows.tolist()


def test_pieces_drawn_ahead_on_a_thread_are_the_pieces_drawn_in_place(prepared, monkeypatch):
    """``ahead`` draws a coming micro-batch on the sampler's thread while the step computes; ``batches``
    then hands over those very batches, cut by the same budget, and forgets them."""
    import threading

    threads: set[str] = set()
    original = Tokenizer.sample

    def spy(self, *args):
        threads.add(threading.current_thread().name)
        return original(self, *args)

    rows, budget = np.arange(0, 200, 3), 120
    expected = sampler(prepared).batches(rows, 4, budget)
    monkeypatch.setattr(Tokenizer, "sample", spy)
    s = sampler(prepared)
    s.ahead(rows, 4, budget)
    s.ahead(rows[:5], 5, budget)  # one never asked for
    got = s.batches(rows, 4, budget)
    assert len(got) == len(expected) > 1
    for a, b in zip(got, expected):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("src", "tgt_in", "tgt_out", "indices"))
    assert {name.split("_")[0] for name in threads} == {"attnmt-subword-sampling"}
    assert list(s._coming) == [(5, budget, tuple(int(i) for i in rows[:5]))]
    s._coming[5, budget, tuple(int(i) for i in rows[:5])].result()
    threads.clear()
    s.batches(rows, 6, budget)  # not drawn ahead: drawn in place
    assert threads == {threading.current_thread().name}


def test_sampled_epochs_are_planned_at_the_budget_over_the_measured_lengthening(prepared):
    """The sampled pairs' mean cost over their plain cost, measured the same way twice; the epochs are
    planned at train.max_tokens over it, so that fewer micro-batches outgrow the budget and are cut."""
    from attnmt.config.schema import config_from_dict
    from attnmt.training.runstart import train_sampler

    s = sampler(prepared)
    split = s.split
    rows = range(min(1000, len(split)))
    costs = [max(len(src), len(tgt)) + 1 for src, tgt in (s.pair(i, 0) for i in rows)]
    expected = sum(costs) / int(split.lengths[: len(rows)].sum())
    assert s.lengthening() == pytest.approx(expected) and expected > 1.02, expected
    cfg = config_from_dict({"data": {"train": {"format": "toy", "split": "train", "size": 5}},
                            "model": {"arch": "lstm"}, "train": {"max_tokens": 300}})
    assert train_sampler(cfg, split, 1, 0, s).max_tokens == int(300 / expected)
    assert train_sampler(cfg, split, 1, 0).max_tokens == 300

    def outgrown(planned) -> int:  # the planned micro-batches that sampling made outgrow the budget
        return sum(len(s.batches(indices, 0, 300)) > 1 for indices in planned.batches(0))

    assert outgrown(train_sampler(cfg, split, 1, 0, s)) < outgrown(train_sampler(cfg, split, 1, 0))


def test_text_lines_reads_each_line_from_the_file(tmp_path):
    lines = ["eins", "", "zwei – drei", "四五"]
    path = tmp_path / "src.txt"
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    text = TextLines(path, 4)
    assert list(text) == lines and text[-1] == "四五"
    with pytest.raises(DataError, match="4 lines, expected 5; run attnmt prepare again"):
        TextLines(path, 5)


# --------------------------------------------------------------------------------- training runs


def train(config: Path, run: Path, *sets: str):
    args = ["train", str(config), "--run-dir", str(run)] + [a for s in sets for a in ("--set", s)]
    return CliRunner().invoke(app, args)


SAMPLING = ("tokenizer.sampling.alpha=0.3", "tokenizer.sampling.nbest=32")


def test_a_resumed_run_with_sampling_equals_the_uninterrupted_one(tiny, tmp_path):
    """26 steps an epoch: the resume at step 20 goes on into epoch 2, whose pieces are drawn anew."""
    config = tiny.config["transformer"]
    straight = tiny.copy_prepared(tmp_path / "straight")
    assert train(config, straight, *SAMPLING, "train.eval_every=100").exit_code == 0
    resumed = tiny.copy_prepared(tmp_path / "resumed")
    assert train(config, resumed, *SAMPLING, "train.eval_every=100", "train.max_steps=20").exit_code == 0
    result = train(config, resumed, *SAMPLING, "train.eval_every=100")
    assert result.exit_code == 0, result.output
    assert "resumed from step_00000020.pt" in result.stdout
    a, b = (load_checkpoint(run / "checkpoints" / step_file(30)) for run in (straight, resumed))
    assert a["progress"]["epoch"] == 1
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # The same run without sampling trains on other pieces.
    plain = tiny.copy_prepared(tmp_path / "plain")
    assert train(config, plain, "train.eval_every=100").exit_code == 0
    c = load_checkpoint(plain / "checkpoints" / step_file(30))
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    # Another alpha cannot resume the run: its batches would not be the ones it trained on.
    changed = train(config, resumed, "tokenizer.sampling.alpha=0.2", "tokenizer.sampling.nbest=32",
                    "train.max_steps=31")
    assert changed.exit_code == 2, changed.output
    assert "tokenizer.sampling.alpha: 0.3 -> 0.2" in assert_one_error_line(changed.stderr)


def test_only_training_sentences_are_ever_sampled(tiny, tmp_path, monkeypatch):
    """An LSTM trained with sampling and validated on dev, then ``eval`` and ``translate`` on dev: every
    sentence sentencepiece sampled is a training one, each pair of each step's batches once a side; the
    translator encodes dev deterministically, as prepare did."""
    drawn: list[tuple[str, str]] = []
    original = Tokenizer.sample

    def spy(self, side, text, *args):
        drawn.append((side, text))
        return original(self, side, text, *args)

    monkeypatch.setattr(Tokenizer, "sample", spy)
    run = tiny.copy_prepared(tmp_path / "run")
    result = train(tiny.config["lstm"], run, *SAMPLING, "train.max_steps=6", "train.eval_every=3")
    assert result.exit_code == 0, result.output
    assert "validation at step 3" in result.stdout
    train_split, dev = load_split(RunDir(run), "train"), load_split(RunDir(run), "dev")
    assert {t for side, t in drawn if side == "src"} <= set(train_split.src_text)
    assert {t for side, t in drawn if side == "tgt"} <= set(train_split.tgt_text)
    trained = sum(1 for side, _ in drawn if side == "src")
    assert trained == sum(1 for side, _ in drawn if side == "tgt") > 0
    sources, references = tmp_path / "dev.src", tmp_path / "dev.ref"
    sources.write_text("".join(f"{x}\n" for x in dev.src_text), encoding="utf-8")
    references.write_text("".join(f"{x}\n" for x in dev.tgt_text), encoding="utf-8")
    before = len(drawn)
    evaluated = CliRunner().invoke(app, ["eval", str(run), "--src", str(sources), "--ref", str(references)])
    assert evaluated.exit_code == 0, evaluated.output
    translated = CliRunner().invoke(app, ["translate", str(run), dev.src_text[0]])
    assert translated.exit_code == 0, translated.output
    assert len(drawn) == before  # nothing sampled outside training
    from attnmt.cli.common import open_translator

    translator, _, _ = open_translator(run)
    assert translator.encode(dev.src_text).ids == [dev.src_ids[i] for i in range(len(dev))]


def test_a_bpe_run_trains_on_bpe_dropouts_pieces(tiny, tmp_path, monkeypatch):
    """``model_type: bpe`` with sampling: prepared and trained, each step's pairs drawn by BPE-dropout, which
    cuts some training sentences into more pieces than the BPE model's deterministic encoding; the trained run
    then translates."""
    drawn: list[tuple[str, list[int]]] = []
    original = Tokenizer.sample

    def spy(self, side, text, *args):
        drawn.append((text, original(self, side, text, *args)))
        return drawn[-1][1]

    monkeypatch.setattr(Tokenizer, "sample", spy)
    run = tmp_path / "run"
    sets = ("tokenizer.model_type=bpe", "tokenizer.sampling.alpha=0.3", "train.max_steps=3")
    result = train(tiny.config["transformer"], run, *sets, "train.eval_every=100")
    assert result.exit_code == 0, result.output
    tokenizer = load_tokenizer(RunDir(run).tokenizer)
    assert is_bpe(model_spec(tokenizer.src_model)) and drawn
    plain = tokenizer.encode_src([text for text, _ in drawn])
    assert sum(len(ids) > len(p) for (_, ids), p in zip(drawn, plain)) > len(drawn) // 4
    assert tokenizer.decode_tgt([ids for _, ids in drawn]) == tokenizer.decode_tgt(plain)
    # The run's saved config loads again: the trained model translates, with nothing sampled.
    before = len(drawn)
    translated = CliRunner().invoke(app, ["translate", str(run), drawn[0][0]])
    assert translated.exit_code == 0, translated.output
    assert len(drawn) == before


def test_sampling_needs_no_new_prepare(tiny, tmp_path):
    """The prepared data does not depend on tokenizer.sampling: a prepared run takes it as it is, and
    preparing it again with the setting keeps its tokenizer and writes the same splits."""
    cfg = load_config(tiny.config["transformer"], list(SAMPLING))
    assert runstart.data_to_prepare(cfg, RunDir(tiny.prepared)) is False
    run = tiny.copy_prepared(tmp_path / "run")
    before = hash_tree(run / "data"), hash_tree(run / "tokenizer")
    prepare(cfg, RunDir(run), workers=1)
    assert (hash_tree(run / "data"), hash_tree(run / "tokenizer")) == before


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(("sets", "expected"), [
    (["tokenizer.sampling.alpha=0"], "--set tokenizer.sampling.alpha: must be > 0.0, got 0"),
    (["tokenizer.sampling.alpha=1.5"], "--set tokenizer.sampling.alpha: must be <= 1.0, got 1.5"),
    (["tokenizer.sampling.alpha=.nan"], "--set tokenizer.sampling.alpha: must be a finite number"),
    (["tokenizer.sampling.nbest=1"],
     "--set tokenizer.sampling.nbest: must be at least 2 (the n best segmentations to draw from), got 1"),
    (["tokenizer.sampling.nbest=-1"],
     "--set tokenizer.sampling.nbest: must be at least 2 (the n best segmentations to draw from), got -1"),
    (["tokenizer.sampling.nbset=4"], "--set tokenizer.sampling.nbset: unknown key (did you mean nbest?)"),
    (["tokenizer.sampling=0.1"], "--set tokenizer.sampling: expected a mapping, got number"),
    (["tokenizer.model_type=bpe", "tokenizer.sampling.nbest=8"],
     "--set tokenizer.sampling.nbest: a unigram model's option; with tokenizer.model_type bpe, sampling is "
     "BPE-dropout, each merge dropped with probability tokenizer.sampling.alpha"),
])
def test_bad_settings_are_one_line_naming_the_key(sets, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(TOY_CONFIG, sets)
    assert str(caught.value) == expected


def test_bad_settings_in_a_file_name_its_line_and_the_cli_prints_one_error_line(tmp_path):
    text = TOY_CONFIG.read_text(encoding="utf-8").replace(
        "  vocab_size: 400\n", "  vocab_size: 400\n  sampling:\n    alpha: 0\n")
    path = tmp_path / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index("    alpha: 0") + 1
    with pytest.raises(ConfigError, match=f"^{path}:{line}: tokenizer.sampling.alpha: must be > 0.0, got 0$"):
        load_config(path)
    result = train(path, tmp_path / "run")
    assert result.exit_code == 2
    assert "tokenizer.sampling.alpha: must be > 0.0" in assert_one_error_line(result.stderr)
    assert not (tmp_path / "run").exists()


def test_sampling_and_guided_alignment_are_refused_together():
    with pytest.raises(ConfigError, match="tokenizer.sampling: cannot go with train.alignment"):
        load_config(TOY_CONFIG.with_name("toy_transformer_guided.yaml"), ["tokenizer.sampling.alpha=0.1"])


def test_defaults():
    cfg = load_config(TOY_CONFIG, ["tokenizer.sampling={}"])
    assert (cfg.tokenizer.sampling.alpha, cfg.tokenizer.sampling.nbest) == (0.1, 16)
    assert load_config(TOY_CONFIG).tokenizer.sampling is None
    assert load_config(TOY_CONFIG, ["tokenizer.model_type=bpe", "tokenizer.sampling.alpha=0.2"]
                       ).tokenizer.sampling.alpha == 0.2

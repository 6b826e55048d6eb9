"""The streamed prepare (issue 23): the same run folder as the list-based prepare it replaced, in any
number of worker processes; memory that does not grow with the corpus; training on the memory-mapped
split with the same losses as the list-based path.

The oracle is ``scripts/check_prepare.py``'s ``compare``: the corpora read into lists, the tokenizer trained
on the whole lists, everything encoded at once, the statistics from ``np.percentile``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import OFFLINE_ENV, REPO, curve, load_script, write_tiny_config
from typer.testing import CliRunner

import attnmt.data.batching
import attnmt.data.spool
import attnmt.training.step
from attnmt.cli import app
from attnmt.config.schema import load_config
from attnmt.data.batching import collate, token_batches
from attnmt.data.prepare import prepare
from attnmt.data.toy import toy_pairs
from attnmt.runfiles import RunDir

check = load_script("check_prepare")


def toy_config(tmp_path: Path, train: dict, **tokenizer) -> Path:
    config = write_tiny_config(tmp_path / "cfg.json")
    data = json.loads(config.read_text())
    data["data"]["train"] = train
    data["data"]["test"] = {"format": "toy", "split": "test", "size": 30}
    data["data"].update(max_len=32, max_ratio=1.15)  # both filters drop pairs of the toy task
    data["tokenizer"].update(tokenizer)
    config.write_text(json.dumps(data))
    return config


@pytest.mark.parametrize("joint", [True, False])
def test_chunks_in_workers_give_the_list_prepares_run_folder(tmp_path, monkeypatch, joint):
    """2,400 toy pairs in chunks of 300 over 2 spawned workers, the tokenizer trained on a sample of 700
    sentences (of 4,800 joint, 2,400 a side): tokenizer, ids, lines, texts, gold alignments and statistics
    all equal the list-based prepare's."""
    monkeypatch.setattr(attnmt.data.spool, "CHUNK", 300)
    config = toy_config(tmp_path, {"format": "toy", "split": "train", "size": 2400}, joint=joint,
                        sample_size=700)
    cfg = load_config(config)
    report = prepare(cfg, RunDir(tmp_path / "run"), workers=2)
    population = "4,800 sentences" if joint else "2,400 sentences per side"
    assert report.tokenizer.startswith(f"trained on 700 of {population}")
    train = report.splits[0]
    assert set(train.dropped) == {"longer than 32 pieces", "length ratio over 1.15"}
    assert check.compare(cfg, tmp_path / "run") == []


def test_what_cleaning_drops_is_counted_across_chunks_as_before(tmp_path, monkeypatch):
    """Empty sides, control characters, colour codes, tabs, CJK and combining marks, in chunks of 7."""
    monkeypatch.setattr(attnmt.data.spool, "CHUNK", 7)
    src, tgt = [], []
    for k in range(60):
        src.append(["a dog \x1b[31mruns\x1b[0m", "", "猫\t喜欢 鱼", f"e\u0301 n {k}", "\x00", "ok"][k % 6])
        tgt.append(["ein hund läuft", "leer", "\x1b[0m", f"cafe\u0301 {k}", "x", "  gut  "][k % 6])
    for name, text in (("train.en", src), ("train.de", tgt)):
        (tmp_path / name).write_text("".join(f"{t}\n" for t in text), encoding="utf-8")
    config = toy_config(tmp_path, {"src": str(tmp_path / "train.en"), "tgt": str(tmp_path / "train.de")},
                        hard_vocab_limit=False)
    cfg = load_config(config, ["data.max_dropped_fraction=0.9", "data.max_ratio=3.0"])
    report = prepare(cfg, RunDir(tmp_path / "run"), workers=1)
    assert list(report.splits[0].dropped)[:2] == ["empty source", "empty target"]  # first seen first
    assert check.compare(cfg, tmp_path / "run") == []


PEAK = """
import sys
from pathlib import Path
from attnmt.config.schema import load_config
from attnmt.data.prepare import prepare
from attnmt.runfiles import RunDir
from attnmt.data.toy import toy_pairs
sets = [f"data.train.src={sys.argv[2]}.en", f"data.train.tgt={sys.argv[2]}.de"]
prepare(load_config(sys.argv[1], sets), RunDir(Path(sys.argv[3])), workers=1)
status = Path("/proc/self/status").read_text()
print(int(status.split("VmHWM:")[1].split()[0]) // 1024)  # its own peak (ru_maxrss counts the parent)
"""


def test_prepare_memory_does_not_grow_with_the_corpus(tmp_path):
    """Peak resident memory of a prepare of 20,000 and of 200,000 distinct pairs (toy pairs with a running
    number, as files; one process; the tokenizer's sample is 4,000 sentences for both). On the 2-core
    machine the list-based prepare peaked at 259 and 624 MB, the streamed one at 82 and 92 MB."""
    text = {"src": str(tmp_path / "corpus.en"), "tgt": str(tmp_path / "corpus.de")}  # replaced by --set
    config = toy_config(tmp_path, text, sample_size=4000)
    pairs = toy_pairs("train", 2000)
    peaks = []
    for size in (20_000, 200_000):
        corpus = tmp_path / f"corpus{size}"
        for suffix, side in (("en", 0), ("de", 1)):
            text = "".join(f"{pairs[k % 2000][side]} {k // 2000}\n" for k in range(size))
            corpus.with_suffix(f".{suffix}").write_text(text, encoding="utf-8")
        args = [sys.executable, "-c", PEAK, str(config), str(corpus), str(tmp_path / f"run{size}")]
        result = subprocess.run(args, cwd=REPO, env={**os.environ, **OFFLINE_ENV}, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        peaks.append(int(result.stdout.split()[-1]))
    assert peaks[1] - peaks[0] < 25, peaks


def test_training_on_the_mapped_split_has_the_list_paths_losses(tiny, tmp_path, monkeypatch):
    """20 steps on the memory-mapped split (batches gathered from the arrays, windows cut a batch at a
    time) against 20 steps with the list-based path (``collate`` of Python lists, ``token_batches`` an
    example at a time): the same losses, gradient norms and learning rates."""

    def run(name: str) -> list[dict]:
        folder = tiny.copy_prepared(tmp_path / name)
        sets = ["train.max_steps=20", "train.log_every=1", "train.eval_every=1000", "train.save_every=1000"]
        args = ["train", str(tiny.config["transformer"]), "--run-dir", str(folder)]
        result = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
        assert result.exit_code == 0, result.output
        return curve(folder)

    mapped = run("mapped")
    with monkeypatch.context() as patch:
        def list_gather(split, indices):
            rows = [int(i) for i in indices]
            return collate([split.src_ids[i] for i in rows], [split.tgt_ids[i] for i in rows], rows)

        def list_cut(lengths, order, max_tokens):
            by_example = dict(zip(order.tolist(), lengths.tolist()))
            return [np.array(b) for b in token_batches(by_example, order.tolist(), max_tokens)]

        patch.setattr(attnmt.training.step, "gather", list_gather)
        patch.setattr(attnmt.data.batching, "sorted_token_batches", list_cut)
        listed = run("listed")
    assert len(mapped) == 20 and mapped == listed

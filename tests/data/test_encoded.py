"""The encoded split on disk and what training reads from it, each against the list-based oracle it
replaced: ``gather`` against ``collate``, ``sorted_token_batches`` against ``token_batches``, the streamed
percentiles against ``np.percentile``, the written split against the lists it was written from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmt.data.batching import collate, gather, sorted_token_batches, token_batches
from attnmt.data.encoded import EncodedSplit, Ragged, SplitWriter, ids_dtype, open_split
from attnmt.data.spool import histogram_percentile
from attnmt.errors import DataError

MADE_BY = "0" * 64  # the hash of the tokenizer the splits written here pretend to come from
ROWS = st.lists(st.lists(st.integers(4, 60_000), max_size=9), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(ROWS, st.data())
def test_gather_gives_collates_batch(src, data):
    tgt = data.draw(st.lists(st.lists(st.integers(4, 60_000), max_size=9), min_size=len(src),
                             max_size=len(src)))
    rows = data.draw(st.lists(st.integers(0, len(src) - 1), min_size=1, max_size=8))
    split = EncodedSplit(Ragged.from_lists(src, np.uint16), Ragged.from_lists(tgt, np.uint16))
    got = gather(split, np.array(rows))
    want = collate([src[i] for i in rows], [tgt[i] for i in rows], rows)
    for name in ("src", "src_lengths", "src_mask", "tgt_in", "tgt_out", "tgt_lengths", "tgt_mask", "indices"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=300), st.integers(1, 700))
def test_sorted_cut_is_the_per_example_rule(lengths, max_tokens):
    lengths = np.sort(np.array(lengths, dtype=np.int32))
    order = np.random.default_rng(0).permutation(len(lengths)).astype(np.int32)
    by_length = np.zeros_like(lengths)
    by_length[order] = lengths  # order[k] has the k-th smallest length
    want = token_batches(by_length, order, max_tokens)
    assert [b.tolist() for b in sorted_token_batches(lengths, order, max_tokens)] == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=200), st.sampled_from([50, 90, 99, 100, 0, 37.5]))
def test_percentile_from_a_histogram_is_numpys(values, p):
    counts = np.bincount(np.array(values, dtype=np.int64), minlength=1)
    want = int(np.percentile(np.array(values), p)) if values else 0
    assert histogram_percentile(counts, p) == want


def write(path: Path, src, tgt, texts=True) -> None:
    writer = SplitWriter(path, ids_dtype(1000), alignments=True, tokenizer_sha256=MADE_BY)
    for start in range(0, len(src), 2):  # two rows a chunk, so that offsets carry over chunks
        s, t = src[start : start + 2], tgt[start : start + 2]
        writer.append({"src_ids": [i for r in s for i in r], "tgt_ids": [i for r in t for i in r],
                       "src_lengths": np.array([len(r) for r in s]),
                       "tgt_lengths": np.array([len(r) for r in t]),
                       "lines": np.arange(start + 1, start + 1 + len(s)),
                       "src": [f"s{start + k} 猫" for k in range(len(s))],
                       "tgt": [f"t{start + k}" for k in range(len(s))], "alignment": ["0-0"] * len(s)})
    writer.commit()


SRC = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13]]
TGT = [[20], [21, 22], [23, 24, 25], [26]]


def test_a_written_split_reads_back_mapped(tmp_path):
    write(tmp_path / "train", SRC, TGT)
    split = open_split(tmp_path / "train", "train")
    assert isinstance(split.src_ids.values, np.memmap) and split.src_ids.values.dtype == np.uint16
    assert list(split.src_ids) == SRC and list(split.tgt_ids) == TGT and split.src_ids[1:3] == SRC[1:3]
    assert split.lines.tolist() == [1, 2, 3, 4] and split.src_text[0] == "s0 猫" and split.gold == ["0-0"] * 4
    assert split.tokenizer_sha256 == MADE_BY and split.largest_ids() == (13, 26)
    assert split.lengths.tolist() == [max(len(s), len(t)) + 1 for s, t in zip(SRC, TGT)]
    assert split.lengths.dtype == np.int32
    assert not [name for name in os.listdir(tmp_path) if name != "train"]  # no temporary left


def test_an_unfinished_split_is_never_read_as_whole(tmp_path):
    writer = SplitWriter(tmp_path / "train", ids_dtype(1000), alignments=False, tokenizer_sha256=MADE_BY)
    writer.append({"src_ids": [5], "tgt_ids": [6], "src_lengths": np.array([1]),
                   "tgt_lengths": np.array([1]), "lines": np.array([1]), "src": ["a"], "tgt": ["b"]})
    assert not (tmp_path / "train").exists()  # written beside it until committed
    writer.abandon()
    assert os.listdir(tmp_path) == []
    write(tmp_path / "dev", SRC, TGT)
    (tmp_path / "dev" / "split.json").unlink()  # as if killed before the last write
    with pytest.raises(DataError, match=r"dev: no split\.json: the encoded dev split is incomplete"):
        open_split(tmp_path / "dev", "dev")


def test_a_truncated_array_is_refused(tmp_path):
    write(tmp_path / "dev", SRC, TGT)
    ids = tmp_path / "dev" / "tgt_ids.bin"
    ids.write_bytes(ids.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"\(tgt_ids\.bin holds 12 bytes, expected 14\); run attnmt prepare"):
        open_split(tmp_path / "dev", "dev")
    meta = json.loads((tmp_path / "dev" / "split.json").read_text())
    assert meta["rows"] == 4 and meta["tokens"] == {"src": 9, "tgt": 7}


@settings(max_examples=60, deadline=None)
@given(ROWS, ROWS, st.integers(1, 7))
def test_the_largest_ids_are_the_lists_max_across_blocks(src, tgt, block):
    split = EncodedSplit(Ragged.from_lists(src, np.uint16), Ragged.from_lists(tgt, np.uint16))
    want = tuple(max((i for row in rows for i in row), default=-1) for rows in (src, tgt))
    assert split.largest_ids(block) == want


@pytest.mark.parametrize("made_by", [7, ["a"], {"sha256": "a"}])
def test_a_tokenizer_hash_that_is_not_text_is_refused(tmp_path, made_by):
    write(tmp_path / "dev", SRC, TGT)
    meta = json.loads((tmp_path / "dev" / "split.json").read_text())
    (tmp_path / "dev" / "split.json").write_text(json.dumps({**meta, "tokenizer_sha256": made_by}))
    with pytest.raises(DataError, match=r"cannot read the encoded dev split \(tokenizer_sha256 .*; run"):
        open_split(tmp_path / "dev", "dev")
    del meta["tokenizer_sha256"]  # a split from before the hash
    (tmp_path / "dev" / "split.json").write_text(json.dumps(meta))
    assert open_split(tmp_path / "dev", "dev").tokenizer_sha256 is None


def test_ids_past_65536_are_kept_whole():
    assert ids_dtype(1 << 16) == np.uint16 and ids_dtype((1 << 16) + 1) == np.int32


def _rss_file_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("RssFile:")[1].split()[0]) / 1024


def test_reading_rows_leaves_no_mapped_pages_behind(tmp_path, monkeypatch):
    """2,000 random rows of a 12 MB split read one batch at a time: the pages they touched are unmapped
    after each read (``Ragged.release``), so the resident memory does not gather the split as a long run
    reads it; without the release, the kernel's 64 KB fault-around maps most of it."""
    rows, width = 400_000, 7
    writer = SplitWriter(tmp_path / "train", ids_dtype(1000), alignments=False, tokenizer_sha256=MADE_BY)
    ids = np.arange(rows * width) % 997
    writer.append({"src_ids": ids, "tgt_ids": ids, "src_lengths": np.full(rows, width),
                   "tgt_lengths": np.full(rows, width), "lines": np.arange(1, rows + 1),
                   "src": [""] * rows, "tgt": [""] * rows})
    writer.commit()
    rng = np.random.default_rng(0)

    def grown_by(split) -> float:
        before = _rss_file_mb()
        for _ in range(20):
            gather(split, rng.integers(0, rows, 100))
        return _rss_file_mb() - before

    assert grown_by(open_split(tmp_path / "train", "train")) < 1.0
    monkeypatch.setattr(Ragged, "release", lambda self: None)
    assert grown_by(open_split(tmp_path / "train", "train")) > 4.0

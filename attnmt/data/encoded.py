"""An encoded split on disk: flat token arrays with offsets, memory-mapped when read back.

A prepared split is the folder ``run/data/<split>/``::

    split.json                 format, rows, the dtype of the ids, the columns, the pairs of each corpus
                               (several training corpora, one after another), the hash of the tokenizer
                               that encoded it (``tokenizer_sha256``); written last
    src_ids.bin  tgt_ids.bin   every sentence's token ids, one after another (uint16, or int32 past 65,536)
    src_offsets.bin  tgt_offsets.bin   int64, rows + 1: sentence i is ids[offsets[i]:offsets[i + 1]]
    lines.bin                  int64: the line of its corpus each pair was read from (1-based)
    src.txt  tgt.txt           the cleaned sentences, one per line (cleaning leaves no line break inside)
    alignment.txt              the toy task's gold word alignments (Pharaoh), when it has them

``SplitWriter`` appends chunks and writes ``split.json`` last into a temporary folder that replaces the
split whole (``runfiles.replace_dir``), so a prepare killed half way leaves no split that looks complete.
``open_split`` maps the arrays (``np.memmap``): reading a 10M-pair split costs no memory until a batch
touches its rows, and there is no Python object per sentence. A split written by attnmt before this
format (a Hugging Face ``datasets`` folder) is still read, into memory. What a split's ids index is the
tokenizer that wrote them: ``batching.load_split`` holds a split to the run folder's tokenizer by the hash
in ``split.json`` (a split from before the hash, by its largest ids: ``EncodedSplit.largest_ids``).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..config.jsonfile import read_json
from ..errors import DataError
from ..runfiles import atomic_write_text, replace_dir

FORMAT = "attnmt-split/1"
META = "split.json"
OFFSETS = np.int64


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype that holds every id of a vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


class Ragged:
    """Variable-length rows over one flat array: row i is ``values[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values, self.offsets = values, offsets

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], dtype: np.dtype | type = np.int32) -> Ragged:
        lengths = np.fromiter((len(r) for r in rows), dtype=OFFSETS, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=OFFSETS)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((i for r in rows for i in r), dtype=dtype, count=int(offsets[-1]))
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.values[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))

    def lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The length of every row (or of ``rows``), int64."""
        if rows is None:
            return np.diff(self.offsets)
        return self.offsets[rows + 1] - self.offsets[rows]

    def padded(self, rows: np.ndarray, width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
        """(len(rows), width) int64 of the rows' values padded with ``pad`` (rows cut at ``width``), and
        their lengths; only the pages that hold these rows are read, and they are released after."""
        starts, lengths = self.offsets[rows], self.lengths(rows)
        column = np.arange(width, dtype=OFFSETS)
        inside = column[None, :] < lengths[:, None]
        positions = np.where(inside, starts[:, None] + column[None, :], 0)
        out = np.where(inside, self.values[positions] if len(self.values) else 0, pad).astype(np.int64)
        self.release()
        return out, lengths

    def release(self) -> None:
        """Unmap the pages of the files that reading mapped into this process. The kernel maps 64 KB around
        each page a read touches, so random rows would otherwise bring the whole split into the resident
        memory of a long run (10M pairs: 800 MB). They stay in the page cache: the next read of them is a
        minor fault. Arrays in memory are left as they are."""
        for array in (self.values, self.offsets):
            mapped = getattr(array, "_mmap", None)
            if mapped is not None:
                mapped.madvise(mmap.MADV_DONTNEED)


class SplitWriter:
    """Writes one split's folder chunk by chunk into ``.NAME.tmp-PID`` beside ``path``; ``commit`` writes
    ``split.json`` and puts the folder in place of ``path``, whole. ``tokenizer_sha256``: the hash of the
    tokenizer that encoded it (``tokenizer.Tokenizer.sha256``), so that no other one reads its ids."""

    def __init__(self, path: Path, dtype: np.dtype, alignments: bool, *, tokenizer_sha256: str) -> None:
        self.path, self.dtype, self.tokenizer_sha256 = Path(path), np.dtype(dtype), tokenizer_sha256
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        names = ["src_ids.bin", "tgt_ids.bin", "src_offsets.bin", "tgt_offsets.bin", "lines.bin", "src.txt",
                 "tgt.txt"] + (["alignment.txt"] if alignments else [])
        self.files = {name: open(self.tmp / name, "wb") for name in names}
        self.rows, self.ends = 0, {"src": 0, "tgt": 0}
        self.corpora: list[int] | None = None  # several training corpora: the pairs of each, in order
        for side in ("src", "tgt"):
            self.files[f"{side}_offsets.bin"].write(np.zeros(1, dtype=OFFSETS).tobytes())

    def append(self, chunk: dict) -> None:
        """``chunk``: ``src_ids``/``tgt_ids`` (flat), ``src_lengths``/``tgt_lengths``, ``lines`` (arrays of
        one chunk's kept rows), ``src``/``tgt`` (their text, one line each) and ``alignment`` if any."""
        for side in ("src", "tgt"):
            ends = self.ends[side] + np.cumsum(chunk[f"{side}_lengths"], dtype=OFFSETS)
            self.files[f"{side}_offsets.bin"].write(ends.tobytes())
            self.files[f"{side}_ids.bin"].write(np.asarray(chunk[f"{side}_ids"], dtype=self.dtype).tobytes())
            self.ends[side] = int(ends[-1]) if len(ends) else self.ends[side]
        self.files["lines.bin"].write(np.asarray(chunk["lines"], dtype=OFFSETS).tobytes())
        for name in ("src", "tgt", "alignment"):
            if f"{name}.txt" in self.files:
                self.files[f"{name}.txt"].write("".join(f"{text}\n" for text in chunk[name]).encode("utf-8"))
        self.rows += len(chunk["lines"])

    def commit(self) -> None:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        meta = {"format": FORMAT, "rows": self.rows, "ids_dtype": self.dtype.name,
                "tokens": dict(self.ends), "alignment": "alignment.txt" in self.files,
                "tokenizer_sha256": self.tokenizer_sha256,
                **({"corpora": self.corpora} if self.corpora else {})}
        atomic_write_text(self.tmp / META, json.dumps(meta, indent=2))
        replace_dir(self.tmp, self.path)

    def abandon(self) -> None:
        for handle in self.files.values():
            handle.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class EncodedSplit:
    """An encoded split as training and validation read it: token ids as ``Ragged`` rows, the cost of each
    pair for the token budget as one array, and the texts read only when asked for."""

    def __init__(self, src_ids: Ragged, tgt_ids: Ragged, lines: np.ndarray | None = None,
                 texts: dict[str, list[str] | Path] | None = None) -> None:
        self.src_ids, self.tgt_ids, self.lines = src_ids, tgt_ids, lines
        self._texts = dict(texts or {})
        self.corpora: list[int] | None = None
        """Several training corpora, one after another: how many pairs each has (``split.json``)."""
        self.tokenizer_sha256: str | None = None
        """The hash of the tokenizer that encoded it (``split.json``); None in a split from before it."""
        self.align: list[np.ndarray] | None = None
        """Guided alignment training: per pair, the (target piece, source piece) links its cross-attention
        is taught to follow (``guided.py``); ``batching.batch`` turns them into ``Batch.align``."""

    @classmethod
    def from_lists(cls, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
                   tgt_text: list[str] | None = None, lines: Sequence[int] | None = None,
                   gold: list[str] | None = None, src_text: list[str] | None = None) -> EncodedSplit:
        texts = {"tgt": tgt_text, "alignment": gold, "src": src_text}
        return cls(Ragged.from_lists(src_ids), Ragged.from_lists(tgt_ids),
                   None if lines is None else np.asarray(lines, dtype=OFFSETS),
                   {k: v for k, v in texts.items() if v is not None})

    def __len__(self) -> int:
        return len(self.src_ids)

    def _text(self, name: str) -> list[str] | None:
        found = self._texts.get(name)
        if isinstance(found, Path):
            found = self._texts[name] = _read_text_lines(found, len(self))
        return found

    @property
    def src_text(self) -> list[str] | None:
        """The cleaned source sentences."""
        return self._text("src")

    @src_text.setter
    def src_text(self, texts: list[str] | None) -> None:
        self._texts["src"] = texts

    @property
    def tgt_text(self) -> list[str]:
        return self._text("tgt") or []

    @tgt_text.setter
    def tgt_text(self, texts: list[str]) -> None:
        self._texts["tgt"] = texts

    def text_file(self, name: str) -> Path | None:
        """The file the texts ``name`` (``src``, ``tgt``) are read from; None once they are in memory."""
        found = self._texts.get(name)
        return found if isinstance(found, Path) else None

    @property
    def gold(self) -> list[str] | None:
        """The toy task's own word alignments (Pharaoh), one per pair."""
        return self._text("alignment")

    @gold.setter
    def gold(self, texts: list[str] | None) -> None:
        self._texts["alignment"] = texts

    def largest_ids(self, block: int = 1 << 24) -> tuple[int, int]:
        """The largest source and target ids (-1 for a side without any), read ``block`` ids at a time, the
        pages released after each: one pass over the arrays."""
        largest = []
        for side in (self.src_ids, self.tgt_ids):
            top = -1
            for start in range(0, len(side.values), block):
                top = max(top, int(side.values[start:start + block].max()))
                side.release()
            largest.append(top)
        return largest[0], largest[1]

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """The cost of each example in a token budget, int32: its longer side, BOS or EOS included.
        Computed a block at a time, so that no int64 array of the corpus's size is ever made."""
        out = np.empty(len(self), dtype=np.int32)
        block = 1 << 20
        for start in range(0, len(self), block):
            rows = np.arange(start, min(start + block, len(self)))
            out[rows] = np.maximum(self.src_ids.lengths(rows), self.tgt_ids.lengths(rows)) + 1
            self.src_ids.release()
            self.tgt_ids.release()
        return out


def _read_text_lines(path: Path, rows: int) -> list[str]:
    text = path.read_bytes().decode("utf-8").split("\n")
    if len(text) != rows + 1:
        raise DataError(f"{path}: {len(text) - 1} lines, expected {rows}; run attnmt prepare again")
    return text[:-1]


def open_split(path: Path, name: str) -> EncodedSplit:
    """The split in ``path`` (``name``, ``train``/``dev``/``test``, for messages), its arrays mapped."""
    meta_path = path / META
    if not meta_path.exists():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            return _open_legacy(path, name)
        raise DataError(f"{path}: no {META}: the encoded {name} split is incomplete; "
                        "run attnmt prepare again")
    try:
        meta = read_json(meta_path, DataError)
    except DataError as e:
        raise DataError(f"{e}; run attnmt prepare again") from None
    try:
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        rows, dtype = int(meta["rows"]), np.dtype(meta["ids_dtype"])
        sides = [Ragged(_map(path / f"{side}_ids.bin", dtype, int(meta["tokens"][side])),
                        _map(path / f"{side}_offsets.bin", np.dtype(OFFSETS), rows + 1))
                 for side in ("src", "tgt")]
        lines = _map(path / "lines.bin", np.dtype(OFFSETS), rows)
        corpora = [int(n) for n in meta["corpora"]] if "corpora" in meta else None
        if corpora is not None and sum(corpora) != rows:
            raise ValueError(f"corpora of {sum(corpora)} pairs in all, but {rows} rows")
        made_by = meta.get("tokenizer_sha256")  # absent in a split written before it
        if made_by is not None and not isinstance(made_by, str):
            raise ValueError(f"tokenizer_sha256 {made_by!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: cannot read the encoded {name} split ({e}); "
                        "run attnmt prepare again") from None
    texts = {"src": path / "src.txt", "tgt": path / "tgt.txt"}
    if meta.get("alignment"):
        texts["alignment"] = path / "alignment.txt"
    split = EncodedSplit(*sides, lines, texts)
    split.corpora = corpora
    split.tokenizer_sha256 = made_by
    return split


def _map(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` from ``path``, memory-mapped; a ValueError when the size differs."""
    size = os.path.getsize(path)
    if size != count * dtype.itemsize:
        raise ValueError(f"{path.name} holds {size} bytes, expected {count * dtype.itemsize}")
    if count == 0:  # mmap cannot map an empty file
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def _open_legacy(path: Path, name: str) -> EncodedSplit:
    """A split that an attnmt before ``FORMAT`` wrote with Hugging Face ``datasets``, read into memory."""
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: cannot read the encoded {name} split ({type(e).__name__}); "
                        "run attnmt prepare again") from None
    columns = ds.column_names
    return EncodedSplit.from_lists(ds["src_ids"], ds["tgt_ids"], ds["tgt"],
                                   ds["line"] if "line" in columns else None,
                                   ds["alignment"] if "alignment" in columns else None, ds["src"])

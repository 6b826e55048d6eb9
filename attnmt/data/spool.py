"""A split streamed through prepare a chunk at a time: read and cleaned into a spool file, sampled for the
tokenizer, then encoded, filtered and counted into the split's arrays (``encoded.SplitWriter``).

Memory holds a few chunks of ``CHUNK`` pairs (``pool.ordered_map``), the tokenizer's sample and one
histogram of lengths per side, whatever the corpus's size. Cleaning and encoding run in ``workers``
processes; the results do not depend on how many.

The spool (``data/.prepare.tmp-PID/<split>.tsv``) holds one kept pair per line, ``line TAB source TAB
target`` (and ``TAB alignment`` for the toy task): cleaning leaves no tab or line break in a sentence.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config.schema import Source, TokenizerConfig, ToySource
from ..errors import os_error
from .encoded import SplitWriter
from .pool import chunked, ordered_map
from .readers import clean, drop_reason, raw_pairs
from .tokenizer import UNK_ID, Tokenizer

CHUNK = 16384
PERCENTILES = (50, 90, 99, 100)


@dataclass
class Spooled:
    """A split read and cleaned into ``path``."""

    name: str
    path: Path
    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    alignments: bool = False
    parts: list[int] = field(default_factory=list)  # the pairs kept of each corpus, in order (several: train)


def _merge(total: dict[str, int], counts: dict[str, int]) -> None:
    for reason, n in counts.items():  # in the order the reasons first appear in the corpus
        total[reason] = total.get(reason, 0) + n


def clean_chunk(task: tuple[list[tuple[str, str, int, str | None]], str]
                ) -> tuple[str, int, dict[str, int]]:
    """The spool lines of a chunk's kept pairs, how many, and why the others were dropped; the task is the
    chunk's rows and the control tokens put before each kept source ("" for none)."""
    rows, prefix = task
    out, dropped = [], {}
    for src, tgt, line, alignment in rows:
        src, tgt = clean(src), clean(tgt)
        reason = drop_reason(src, tgt)
        if reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        src = f"{prefix} {src}" if prefix else src
        if alignment is None:
            out.append(f"{line}\t{src}\t{tgt}\n")
        else:
            out.append(f"{line}\t{src}\t{tgt}\t{alignment}\n")
    return "".join(out), len(out), dropped


def spool_split(sources: Source | list[Source], name: str, path: Path, workers: int,
                prefixes: list[str] | None = None) -> Spooled:
    """Read ``sources`` (one corpus or several, one after another) and write their cleaned pairs to
    ``path``, each source after its corpus's control tokens (``prefixes``, one per corpus); what was read,
    kept and dropped, and how many pairs of each corpus were kept (``parts``)."""
    corpora = sources if isinstance(sources, list) else [sources]
    prefixes = prefixes or [""] * len(corpora)
    spooled = Spooled(name, path, alignments=isinstance(corpora[0], ToySource))
    try:  # the corpora's own read errors are data's DataErrors: an OSError here is the spool's
        _write_spool(spooled, corpora, prefixes, workers)
    except OSError as e:
        raise os_error(path, e) from None
    return spooled


def _write_spool(spooled: Spooled, corpora: list[Source], prefixes: list[str], workers: int) -> None:
    """``spool_split``'s work: the corpora's cleaned pairs into ``spooled.path``, counted in ``spooled``."""
    name = spooled.name
    with open(spooled.path, "w", encoding="utf-8", newline="\n") as out:
        for source, prefix in zip(corpora, prefixes):
            kept_before = spooled.kept

            def chunks(source=source, prefix=prefix) -> Iterator[tuple]:
                for chunk in chunked(raw_pairs(source, name), CHUNK):
                    spooled.read += len(chunk)
                    yield chunk, prefix

            for text, kept, dropped in ordered_map(clean_chunk, chunks(), workers):
                out.write(text)
                spooled.kept += kept
                _merge(spooled.dropped, dropped)
            spooled.parts.append(spooled.kept - kept_before)


def spool_rows(path: Path, size: int | None = None) -> Iterator[list[str]]:
    """The spool's lines in chunks (of ``CHUNK``), each line still with its tabs and line break."""
    with open(path, encoding="utf-8", newline="\n") as spool:
        yield from chunked(spool, size or CHUNK)


# ------------------------------------------------------------------------------ the tokenizer's sample


def sample_positions(size: int, k: int, seed: int) -> list[int]:
    """Which of ``size`` sentences the tokenizer is trained on, in the order it sees them: all, or ``k``
    chosen by ``random.Random(seed)``, as ``tokenizer.train_model`` chooses from a list of ``size``."""
    return list(range(size)) if size <= k else random.Random(seed).sample(range(size), k)


def tokenizer_sample(spooled: Spooled, cfg: TokenizerConfig, seed: int) -> list[list[str]]:
    """The sentences each tokenizer model is trained on: one list (joint: sources then targets) or two
    (source, target), each at most ``cfg.sample_size`` long, read from the spool in one pass."""
    n = spooled.kept
    if cfg.joint:
        wanted = [(sample_positions(2 * n, cfg.sample_size, seed), 0)]
    else:
        positions = sample_positions(n, cfg.sample_size, seed)  # the same for both sides, as train_model's
        wanted = [(positions, 0), (positions, n)]
    samples = []
    slots = {}  # population position -> [(sample, slot)]
    for m, (positions, base) in enumerate(wanted):
        samples.append([""] * len(positions))
        for slot, position in enumerate(positions):
            slots.setdefault(position + base, []).append((m, slot))
    row = 0
    for chunk in spool_rows(spooled.path):
        for line in chunk:
            if row in slots or row + n in slots:
                parts = line.rstrip("\n").split("\t")
                for position, text in ((row, parts[1]), (row + n, parts[2])):
                    for m, slot in slots.get(position, ()):
                        samples[m][slot] = text
            row += 1
    return samples


# ------------------------------------------------------------------------------ encoding


@dataclass(frozen=True)
class Filters:
    """The training split's length filters (None: keep every pair, as for dev and test)."""

    max_len: int | None = None
    max_ratio: float | None = None


_TOKENIZER: list = [None, None]  # a worker's tokenizer and the model bytes it was made from


def _tokenizer(models: tuple[bytes, bytes, bool, bytes | None]) -> Tokenizer:
    if _TOKENIZER[1] != models:
        _TOKENIZER[:] = [Tokenizer(*models), models]
    return _TOKENIZER[0]


def encode_chunk(task: tuple[list[str], tuple[bytes, bytes, bool, bytes | None], Filters, str, int]) -> dict:
    """A chunk of spool lines encoded and filtered: ``SplitWriter.append``'s arrays and texts of the kept
    pairs, with ``dropped`` (reason -> count), ``unk`` (per side), ``histogram`` (lengths, per side) and
    ``part`` (the task's last item: the corpus the lines are of)."""
    lines, models, filters, dtype, part = task
    tokenizer = _tokenizer(models)
    rows = [line.rstrip("\n").split("\t") for line in lines]
    src_text, tgt_text = [r[1] for r in rows], [r[2] for r in rows]
    ids = {"src": tokenizer.encode_src(src_text), "tgt": tokenizer.encode_tgt(tgt_text)}
    lengths = {side: np.fromiter(map(len, ids[side]), dtype=np.int64, count=len(rows)) for side in ids}
    keep, dropped = _filter(lengths["src"], lengths["tgt"], filters)
    kept = np.flatnonzero(keep).tolist()
    out = {"part": part, "dropped": dropped,
           "lines": np.array([int(rows[i][0]) for i in kept], dtype=np.int64),
           "src": [src_text[i] for i in kept], "tgt": [tgt_text[i] for i in kept], "unk": {}, "histogram": {}}
    if rows and len(rows[0]) > 3:
        out["alignment"] = [rows[i][3] for i in kept]
    for side in ("src", "tgt"):
        flat = np.fromiter(itertools.chain.from_iterable(ids[side][i] for i in kept), dtype=dtype,
                           count=int(lengths[side][keep].sum()))
        out[f"{side}_ids"], out[f"{side}_lengths"] = flat, lengths[side][keep]
        out["unk"][side] = int(np.count_nonzero(flat == UNK_ID))
        out["histogram"][side] = np.bincount(lengths[side][keep])
    return out


def _filter(src: np.ndarray, tgt: np.ndarray, filters: Filters) -> tuple[np.ndarray, dict[str, int]]:
    """Which pairs the filters keep, and how many each dropped (length first, then the ratio among the
    rest)."""
    keep, dropped = np.ones(len(src), dtype=bool), {}
    if filters.max_len is not None:
        short = (src <= filters.max_len) & (tgt <= filters.max_len)
        if not short.all():
            dropped[f"longer than {filters.max_len} pieces"] = int((~short).sum())
        keep &= short
    if filters.max_ratio is not None:
        unequal = np.maximum(src, tgt) > filters.max_ratio * np.minimum(src, tgt)
        if (unequal & keep).any():
            dropped[f"length ratio over {filters.max_ratio:g}"] = int((unequal & keep).sum())
        keep &= ~unequal
    return keep, dropped


@dataclass
class Counts:
    """What an encoded split adds up to: what was dropped, tokens, unknown pieces and a histogram of
    lengths per side."""

    cleaning: dict[str, int] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)
    kept: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {"src": 0, "tgt": 0})
    unk: dict[str, int] = field(default_factory=lambda: {"src": 0, "tgt": 0})
    histogram: dict[str, np.ndarray] = field(default_factory=lambda: {"src": np.zeros(1, np.int64),
                                                                         "tgt": np.zeros(1, np.int64)})

    def add(self, chunk: dict) -> None:
        _merge(self.filtered, chunk["dropped"])
        self.kept += len(chunk["lines"])
        for side in ("src", "tgt"):
            self.tokens[side] += int(chunk[f"{side}_lengths"].sum())
            self.unk[side] += chunk["unk"][side]
            counts, total = chunk["histogram"][side], self.histogram[side]
            if len(counts) > len(total):
                total = np.concatenate([total, np.zeros(len(counts) - len(total), np.int64)])
                self.histogram[side] = total
            total[: len(counts)] += counts

    @property
    def dropped(self) -> dict[str, int]:
        """Cleaning's reasons in the order they first appeared, then the length filter's, then the ratio's."""
        filters = sorted(self.filtered.items(), key=lambda item: not item[0].startswith("longer"))
        return {**self.cleaning, **dict(filters)}

    def percentiles(self, side: str) -> dict[str, int]:
        return {f"p{p}" if p < 100 else "max": histogram_percentile(self.histogram[side], p)
                for p in PERCENTILES}

    def unk_rate(self, side: str) -> float:
        return self.unk[side] / self.tokens[side] if self.tokens[side] else 0.0


def histogram_percentile(counts: np.ndarray, p: float) -> int:
    """``int(np.percentile(values, p))`` (linear interpolation) of the values whose histogram is ``counts``
    (``counts[v]``: how many equal v), without the values; 0 for none."""
    n = int(counts.sum())
    if n == 0:
        return 0
    cumulative = np.cumsum(counts)
    index = (n - 1) * (p / 100)
    below = int(np.floor(index))
    a, b = (int(np.searchsorted(cumulative, i, side="right")) for i in (below, min(below + 1, n - 1)))
    t = index - below
    value = b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t
    return int(value)


def encode_spooled(spooled: Spooled, tokenizer: Tokenizer, filters: Filters, writer: SplitWriter,
                   workers: int) -> tuple[Counts, list[int]]:
    """Encode the spool of a split into ``writer`` (which the caller commits); its counts, and the pairs each
    corpus of the spool's ``parts`` still has after the filters (a chunk never spans two corpora)."""
    models = (tokenizer.src_model, tokenizer.tgt_model, tokenizer.joint, tokenizer.pieces)
    parts = spooled.parts or [spooled.kept]
    tasks = ((lines, models, filters, writer.dtype.name, part)
             for part, lines in _part_chunks(spooled.path, parts))
    counts = Counts(dict(spooled.dropped))  # cleaning's
    kept = [0] * len(parts)
    for chunk in ordered_map(encode_chunk, tasks, workers):
        writer.append(chunk)
        counts.add(chunk)
        kept[chunk["part"]] += len(chunk["lines"])
    return counts, kept


def _part_chunks(path: Path, parts: list[int]) -> Iterator[tuple[int, list[str]]]:
    """(corpus, lines) chunks of the spool, at most ``CHUNK`` lines, none across two corpora."""
    with open(path, encoding="utf-8", newline="\n") as spool:
        for part, size in enumerate(parts):
            left = size
            while left:
                lines = list(itertools.islice(spool, min(left, CHUNK)))
                if not lines:
                    return
                left -= len(lines)
                yield part, lines

"""Subword regularisation (``tokenizer.sampling``): the training pairs segmented anew at every epoch.

Each pair of the training split is read back as its cleaned text (``src.txt``, ``tgt.txt`` of the encoded
split) and cut into pieces by ``Tokenizer.sample``: unigram sampling (Kudo 2018) among the ``nbest`` best
segmentations, or BPE-dropout (Provilkov et al. 2020, ``bpe_dropout``) for a BPE model, each merge dropped
with probability ``alpha``. Only the optimizer steps' batches of the train split are sampled; validation,
the test set, ``translate``, ``eval``, ``score`` and every other reader of a split or of the tokenizer keep
the one deterministic segmentation.

Determinism: example i's pieces at epoch e are a pure function of (``train.seed``, e, i, side): the
generator (numpy's) is seeded from a hash of those for each sentence. A resumed run, N ranks, or one rank
accumulating N micro-batches see the same pieces, whatever batch an example falls in.

Lengths: a sampled side longer than the model accepts (``data.max_len`` pieces, and for a Transformer
``model.max_positions`` - 1) falls back to its deterministic segmentation. Budget: batches are planned
from the deterministic lengths (``batching.TokenBatchSampler``), and sampling makes most pairs longer;
a micro-batch whose sampled padded size exceeds ``train.max_tokens`` is cut by the same budget rule
(``batching.token_batches``) into parts that are run one after another in the same step; to keep those
rare, the epochs' batches are planned with ``train.max_tokens`` over the sampled pairs' measured
lengthening (``SubwordSampler.lengthening``), so that a typical sampled batch fills the budget. The loss is
still normalised by the step's target tokens, so ``train.max_tokens`` stays a bound on every forward
pass (an example over it alone still goes alone), at the cost of more, smaller passes.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..config.schema import Config, SamplingConfig
from ..errors import DataError
from .batching import Batch, collate, token_batches
from .encoded import EncodedSplit
from .tokenizer import Tokenizer

SIDES = ("src", "tgt")


def example_seed(seed: int, epoch: int, index: int, side: str) -> int:
    """The seed of one side of one example's draw in one epoch (32 bits)."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}/{side}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 0xFFFFFFFF


class TextLines(Sequence[str]):
    """The lines of a UTF-8 file, each read when asked for from a memory map: no Python object per line
    (a 10M-pair split's texts would take gigabytes as a list). ``rows``: the number of lines expected."""

    def __init__(self, path: Path, rows: int) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as handle:
                size = handle.seek(0, 2)
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:
            raise DataError(f"{self.path}: cannot read ({e.strerror}); run attnmt prepare again") from None
        data = np.frombuffer(self._map, dtype=np.uint8)
        block = 1 << 26  # so that no byte-sized mask of the whole file is ever made
        ends = [np.flatnonzero(data[start:start + block] == 10) + start
                for start in range(0, len(data), block)]
        self._ends = np.concatenate(ends) if ends else np.empty(0, dtype=np.int64)
        del data
        if len(self._ends) != rows or (size and self._ends[-1] != size - 1):
            raise DataError(f"{self.path}: {len(self._ends)} lines, expected {rows}; "
                            "run attnmt prepare again")

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):  # Sequence's contract: an int gives a line (slices are not needed here)
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        start = int(self._ends[i - 1]) + 1 if i else 0
        return bytes(self._map[start:int(self._ends[i])]).decode("utf-8")

    def release(self) -> None:
        """Unmap the pages reading brought in (as ``encoded.Ragged.release``); they stay in the page cache."""
        if isinstance(self._map, mmap.mmap):
            self._map.madvise(mmap.MADV_DONTNEED)


def texts_of(split: EncodedSplit, side: str) -> Sequence[str]:
    """The cleaned sentences of one side of ``split``, from its file when it has one."""
    path = split.text_file(side)
    if path is not None:
        return TextLines(path, len(split))
    texts = split.src_text if side == "src" else split.tgt_text
    if texts is None or len(texts) != len(split):
        raise DataError(f"tokenizer.sampling: the training split has no {side} texts to sample from; "
                        "run attnmt prepare again")
    return texts


class SubwordSampler:
    """The training pairs of ``split`` segmented by sampling, by (``seed``, epoch, index); each side at most
    ``longest`` pieces."""

    def __init__(self, tokenizer: Tokenizer, split: EncodedSplit, sampling: SamplingConfig, seed: int,
                 longest: int) -> None:
        self.tokenizer, self.split, self.sampling = tokenizer, split, sampling
        self.seed, self.longest = seed, longest
        self.texts = {side: texts_of(split, side) for side in SIDES}
        self.ids = {"src": split.src_ids, "tgt": split.tgt_ids}
        self._thread: ThreadPoolExecutor | None = None  # draws ``ahead``
        self._coming: dict[tuple, Future] = {}

    def pair(self, index: int, epoch: int) -> tuple[list[int], list[int]]:
        """Example ``index``'s (source, target) pieces in ``epoch``."""
        out = []
        for side in SIDES:
            seed = example_seed(self.seed, epoch, index, side)
            ids = self.tokenizer.sample(side, self.texts[side][index], self.sampling.alpha,
                                        self.sampling.nbest, seed)
            out.append(ids if len(ids) <= self.longest else self.ids[side][index])
        return out[0], out[1]

    def lengthening(self, examples: int = 1000) -> float:
        """How much longer sampling makes a pair's cost in the token budget (its longer side, BOS/EOS
        counted): the cost of the first ``examples`` pairs at epoch 0 over their deterministic cost (at
        least 1). The same for the same seed and data, so a resumed run plans the batches it planned."""
        rows = range(min(examples, len(self.split)))
        sampled = sum(max(len(src), len(tgt)) + 1 for src, tgt in (self.pair(i, 0) for i in rows))
        plain = int(self.split.lengths[: len(rows)].sum())
        return max(1.0, sampled / plain) if plain else 1.0

    def ahead(self, indices: Sequence[int] | np.ndarray, epoch: int, max_tokens: int) -> None:
        """Start drawing a coming micro-batch's ``batches`` on a thread of their own, while the current step
        computes (torch releases the interpreter inside its operations); ``batches`` then takes them."""
        key = (epoch, max_tokens, tuple(int(i) for i in indices))
        if len(self._coming) > 64:  # drawn for steps that never came (a run stopped, an epoch cut short)
            self._coming.clear()
        if key not in self._coming:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="attnmt-subword-sampling")
            self._coming[key] = self._thread.submit(self._batches, key[2], epoch, max_tokens)

    def batches(self, indices: Sequence[int] | np.ndarray, epoch: int, max_tokens: int) -> list[Batch]:
        """The examples ``indices`` segmented for ``epoch``, as one ``Batch``, or as several when their padded
        size would exceed ``max_tokens`` (cut by ``batching.token_batches``, the shortest first). Drawn here,
        or on the thread ``ahead`` started (the same pieces either way: they depend on nothing else)."""
        rows = tuple(int(i) for i in indices)
        coming = self._coming.pop((epoch, max_tokens, rows), None)
        return coming.result() if coming is not None else self._batches(rows, epoch, max_tokens)

    def _batches(self, rows: tuple[int, ...], epoch: int, max_tokens: int) -> list[Batch]:
        pairs = [self.pair(i, epoch) for i in rows]
        for texts in self.texts.values():
            if isinstance(texts, TextLines):
                texts.release()
        costs = [max(len(src), len(tgt)) + 1 for src, tgt in pairs]  # the budget's cost: BOS/EOS counted
        if not rows or max(costs) * len(rows) <= max_tokens:
            parts = [list(range(len(rows)))]
        else:
            parts = token_batches(costs, sorted(range(len(rows)), key=costs.__getitem__), max_tokens)
        return [collate([pairs[k][0] for k in part], [pairs[k][1] for k in part], [rows[k] for k in part])
                for part in parts]


def longest_sampled(cfg: Config) -> int:
    """The most pieces a sampled side may have: ``data.max_len`` (what preparing kept), and within a
    Transformer's ``model.max_positions`` (a side takes one more position: EOS, or BOS)."""
    longest = cfg.data.max_len
    if cfg.model.arch == "transformer":
        longest = min(longest, cfg.model.max_positions - 1)
    return longest


"""Token ids -> tensors: the ``Batch``, ``collate``, the token budget, a length-bucketed batch sampler,
and the encoded splits of a run folder read back (``load_split``), each held to the run folder's tokenizer.

Letters: B batch, S source length, T target length.

The sampler's batches are a pure function of (lengths, max_tokens, seed, epoch): there is nothing to
skip or replay on resume, only an index into the epoch's list. Dealt to N ranks, every example is used
exactly once per epoch and every rank takes the same number of steps (``TokenBatchSampler``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..runfiles import RunDir
from .encoded import EncodedSplit, open_split
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, folder_sha256, load_tokenizer


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """Key-padding mask from sequence lengths.

    lengths: (B,) integer lengths. max_len: width S, default `lengths.max()`.
    Returns (B, S) bool, True where position < length (a real token).
    """
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() > 0 else 0
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (B, S)



@dataclass
class Batch:
    """A padded batch; masks are boolean with True = a real token (may be attended to)."""

    src: torch.Tensor  # (B, S) source ids + EOS
    src_lengths: torch.Tensor  # (B,)
    src_mask: torch.Tensor  # (B, S)
    tgt_in: torch.Tensor  # (B, T) BOS + target ids: the decoder's input
    tgt_out: torch.Tensor  # (B, T) target ids + EOS: what it must predict
    tgt_lengths: torch.Tensor  # (B,)
    tgt_mask: torch.Tensor  # (B, T)
    indices: torch.Tensor  # (B,) positions of the examples in their corpus
    align: torch.Tensor | None = None  # (B, T, S) guided alignment targets (``alignment_targets``), if any

    @property
    def size(self) -> int:
        return self.src.size(0)

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_lengths.sum())

    @property
    def n_tgt_tokens(self) -> int:
        """Non-pad target tokens: the loss is summed over these."""
        return int(self.tgt_lengths.sum())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                        if getattr(self, f.name) is not None else None for f in fields(self)})


def collate(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]] | None = None,
    indices: Sequence[int] | None = None,
) -> Batch:
    """Pad a list of examples into a ``Batch``; without targets, ``tgt_*`` are empty (B, 0) tensors."""
    n = len(src_ids)
    src_lengths = torch.tensor([len(s) + 1 for s in src_ids], dtype=torch.long)
    src = torch.full((n, int(src_lengths.max()) if n else 1), PAD_ID, dtype=torch.long)
    for i, s in enumerate(src_ids):
        src[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        src[i, len(s)] = EOS_ID
    if tgt_ids is None:
        tgt_lengths = torch.zeros(n, dtype=torch.long)
        tgt_in = tgt_out = torch.zeros((n, 0), dtype=torch.long)
    else:
        tgt_lengths = torch.tensor([len(t) + 1 for t in tgt_ids], dtype=torch.long)
        tgt_in = torch.full((n, int(tgt_lengths.max()) if n else 1), PAD_ID, dtype=torch.long)
        tgt_out = tgt_in.clone()
        for i, t in enumerate(tgt_ids):
            t = torch.as_tensor(t, dtype=torch.long)
            tgt_in[i, 0] = BOS_ID
            tgt_in[i, 1 : len(t) + 1] = t
            tgt_out[i, : len(t)] = t
            tgt_out[i, len(t)] = EOS_ID
    return Batch(
        src=src,
        src_lengths=src_lengths,
        src_mask=padding_mask(src_lengths, src.size(1)),
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        tgt_lengths=tgt_lengths,
        tgt_mask=padding_mask(tgt_lengths, tgt_in.size(1)),
        indices=torch.as_tensor(list(indices) if indices is not None else range(n), dtype=torch.long),
    )


def token_batches(lengths: Sequence[int] | np.ndarray, order: Iterable[int] | np.ndarray, max_tokens: int,
                  rows_per_example: int = 1) -> list[list[int]]:
    """Cut ``order`` (indices, usually sorted by length) into batches whose padded size fits ``max_tokens``:
    the one token-budget rule of training, translation and attention maps.

    A batch costs its size times its longest example times ``rows_per_example`` (a beam search decodes
    K rows per sentence); ``lengths`` already counts BOS/EOS. An example over the budget alone gets a
    batch of its own rather than being dropped.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order.tolist() if isinstance(order, np.ndarray) else order:
        n = int(lengths[i])
        if current and max(longest, n) * (len(current) + 1) * rows_per_example > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def sorted_token_batches(lengths: np.ndarray, order: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """``token_batches`` for examples in ascending order of length (``lengths[k]`` is ``order[k]``'s),
    a batch at a time instead of an example at a time: a batch's longest example is then its last, and
    its cost grows with each example added, so its end is the first position over the budget. The same
    batches as ``token_batches(…, order, max_tokens)``, as views of ``order``."""
    batches, start, n = [], 0, len(order)
    while start < n:
        most = max(1, max_tokens // max(int(lengths[start]), 1))  # no batch from here holds more
        cost = lengths[start : start + most].astype(np.int64) * np.arange(1, min(most, n - start) + 1)
        over = np.flatnonzero(cost[1:] > max_tokens)
        size = int(over[0]) + 1 if len(over) else len(cost)
        batches.append(order[start : start + size])
        start += size
    return batches


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, deterministic from (seed, epoch), dealt to ranks.

    ``lengths[i]`` is the cost of example i: max(source, target) tokens including BOS/EOS. For an epoch,
    examples are shuffled with a generator seeded by (seed, epoch), sorted by length inside windows of
    ``bucket_batches`` batches' worth of examples (so batches hold similar lengths but the corpus order
    still varies), cut into batches, and the batches are shuffled. If the number of batches is not a
    multiple of ``num_replicas * multiple_of``, the largest batches are split in two until it is, so
    every rank takes the same number of steps and every example is still used exactly once.
    Rank r takes global batches r, r + N, r + 2N, ...: with N ranks a step sees the same examples as
    one rank accumulating N consecutive batches. With ``weights`` (one per corpus of ``corpora``, the
    pairs of each, one corpus after another), an epoch's examples are drawn by ``corpus_draws`` instead
    of taken once each.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        multiple_of: int = 1,
        bucket_batches: int = 100,
        corpora: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.lengths = np.asarray(lengths)
        if self.lengths.dtype.kind not in "iu":
            self.lengths = self.lengths.astype(np.int64)
        # Half the memory for a corpus of fewer than 2^31 examples (10M pairs: 40 MB instead of 80 MB).
        self.index_dtype = np.int32 if len(self.lengths) < 2**31 else np.int64
        self._cached: tuple[int, list[np.ndarray]] | None = None
        self.max_tokens = max_tokens
        self.seed, self.shuffle = seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.batches_per_step = num_replicas * multiple_of
        self.bucket_batches = bucket_batches
        self.corpora, self.weights = corpora, weights  # several corpora drawn by weight (``corpus_draws``)
        if weights is not None and (corpora is None or len(corpora) != len(weights)
                                    or sum(corpora) != len(self.lengths)):
            raise ValueError(f"{len(weights)} corpus weights for corpora of {corpora} pairs")
        if len(self.lengths) < self.batches_per_step:
            raise DataError(
                f"epoch has 0 steps: {len(self.lengths)} examples cannot fill {num_replicas} rank(s) x "
                f"{multiple_of} accumulation step(s) (max_tokens={max_tokens})"
            )

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of ``epoch``, in order, as arrays of example indices; the same on every rank.
        The last epoch's are kept: each epoch is computed once."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        n = len(self.lengths)
        rng = np.random.default_rng([self.seed, epoch])
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")
            cut = token_batches(self.lengths, order, self.max_tokens)
            batches = [np.asarray(b, dtype=np.int64) for b in cut]
        else:
            order = (rng.permutation(n) if self.weights is None
                     else corpus_draws(self.corpora, self.weights, rng))
            mean_len = max(1.0, float(self.lengths.mean()))
            window = max(1, int(self.bucket_batches * self.max_tokens / mean_len))
            batches = []
            for start in range(0, n, window):
                chunk = order[start : start + window]
                chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")].astype(self.index_dtype)
                batches.extend(sorted_token_batches(self.lengths[chunk], chunk, self.max_tokens))
            del order
            batches = [batches[i] for i in rng.permutation(len(batches))]
        batches = self._make_divisible(batches)
        self._cached = (epoch, batches)
        return batches

    def _make_divisible(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        while len(batches) % self.batches_per_step:
            i = max(range(len(batches)), key=lambda b: (len(batches[b]), -b))
            if len(batches[i]) >= 2:  # split the batch with most examples in two
                big, half = batches[i], len(batches[i]) // 2
                batches[i : i + 1] = [big[:half], big[half:]]
            else:
                # Every batch holds one example (each over half the budget): merge the last two instead,
                # one batch over budget rather than an example lost. There are >= batches_per_step
                # batches, so this ends.
                batches[-2:] = [np.concatenate(batches[-2:])]
        return batches

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch``."""
        return self.global_batches(epoch)[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        """Steps per epoch for this rank (the same on every rank; may vary slightly between epochs)."""
        return len(self.batches(0))

    def iter_from(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` from batch index ``start`` on (resume)."""
        yield from self.batches(epoch)[start:]


def corpus_draws(sizes: Sequence[int], weights: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """One epoch's examples from corpora of ``sizes`` pairs (one after another in the split), weighted: as
    many as the corpora hold in all, each from corpus k with probability weights[k] / sum(weights) (one
    multinomial draw of the counts), taken from the corpus in a shuffled order that starts again when it
    runs out (so a small corpus repeats, a large one is cut), all shuffled together. An empty corpus
    gets none."""
    sizes_ = np.asarray(sizes, dtype=np.int64)
    p = np.where(sizes_ > 0, np.asarray(weights, dtype=np.float64), 0.0)
    counts = rng.multinomial(int(sizes_.sum()), p / p.sum())
    starts = np.concatenate([[0], np.cumsum(sizes_)[:-1]])
    parts = []
    for start, size, count in zip(starts.tolist(), sizes_.tolist(), counts.tolist()):
        if count:
            rounds = -(-count // size)
            parts.append(np.concatenate([rng.permutation(size) for _ in range(rounds)])[:count] + start)
    return rng.permutation(np.concatenate(parts))


# ------------------------------------------------------------------------------ encoded splits


def gather(split: EncodedSplit, indices: Sequence[int] | np.ndarray) -> Batch:
    """The ``Batch`` of ``split``'s examples ``indices``, read straight from its (memory-mapped) arrays:
    the same tensors as ``collate`` of those examples' lists."""
    rows = np.asarray(indices, dtype=np.int64)
    src_width = int(split.src_ids.lengths(rows).max()) + 1 if len(rows) else 1
    tgt_width = int(split.tgt_ids.lengths(rows).max()) + 1 if len(rows) else 1
    src, src_len = split.src_ids.padded(rows, src_width, PAD_ID)
    tgt, tgt_len = split.tgt_ids.padded(rows, tgt_width, PAD_ID)
    everyone = np.arange(len(rows))
    src[everyone, src_len] = EOS_ID
    tgt_in = np.concatenate([np.full((len(rows), 1), BOS_ID), tgt[:, :-1]], axis=1)
    tgt[everyone, tgt_len] = EOS_ID
    src_lengths, tgt_lengths = torch.from_numpy(src_len + 1), torch.from_numpy(tgt_len + 1)
    batch = Batch(
        src=torch.from_numpy(src),
        src_lengths=src_lengths,
        src_mask=padding_mask(src_lengths, src_width),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt),
        tgt_lengths=tgt_lengths,
        tgt_mask=padding_mask(tgt_lengths, tgt_width),
        indices=torch.from_numpy(rows),
    )
    if split.align is not None:
        batch.align = alignment_targets([split.align[i] for i in rows.tolist()], tgt_width, src_width)
    return batch


def alignment_targets(links: Sequence[np.ndarray], T: int, S: int) -> torch.Tensor:
    """(B, T, S) attention targets from (target piece, source piece) links: each target piece's row spreads
    1 evenly over its linked source pieces; a piece without links (and padding, EOS) has a row of zeros."""
    target = torch.zeros(len(links), T, S)
    for b, pairs in enumerate(links):
        if len(pairs):
            pairs = torch.as_tensor(pairs, dtype=torch.long)
            target[b, pairs[:, 0], pairs[:, 1]] = 1.0
    return target / target.sum(-1, keepdim=True).clamp(min=1.0)


def load_split(run: RunDir, name: str) -> EncodedSplit | None:
    """The encoded split ``name`` of a prepared run folder, its arrays memory-mapped, made by the run
    folder's tokenizer (``check_made_by``); None if the config has no such split."""
    path = run.split(name)
    if not path.exists():
        return None
    split = open_split(path, name)
    check_made_by(split, path, run)
    return split


def check_made_by(split: EncodedSplit, path: Path, run: RunDir) -> None:
    """A DataError naming both folders unless ``split`` (read from ``path``) was encoded by the tokenizer in
    ``run.tokenizer``: a run folder's ``data/`` and ``tokenizer/`` from two runs would feed the model ids of
    another vocabulary (an embedding read out of range, or training on the wrong pieces in silence)."""
    fix = f"copy data/ and tokenizer/ together from one run, or run attnmt prepare again on {run.root}"
    if split.tokenizer_sha256 is not None:
        here = folder_sha256(run.tokenizer)
        if split.tokenizer_sha256 != here:
            raise DataError(f"{path}: encoded by another tokenizer than the one in {run.tokenizer} (sha256 "
                            f"{split.tokenizer_sha256[:12]}…, that one {here[:12]}…); {fix}")
        return
    # A split that an attnmt before the hash wrote is accepted (rather than making every older run folder
    # prepare again): only its largest ids are held to the vocabulary, one pass over its arrays, which finds a
    # split from a larger vocabulary (the IndexError it would raise in the embedding), not one of equal size.
    tokenizer = load_tokenizer(run.tokenizer)
    src, tgt = split.largest_ids()
    if src >= tokenizer.src_vocab_size or tgt >= tokenizer.tgt_vocab_size:
        raise DataError(f"{path}: encoded by another tokenizer than the one in {run.tokenizer} (its ids "
                        f"reach {src} source, {tgt} target; that one has {tokenizer.src_vocab_size} source, "
                        f"{tokenizer.tgt_vocab_size} target pieces); {fix}")

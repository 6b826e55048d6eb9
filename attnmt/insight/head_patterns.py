"""What one attention head does, from its maps alone: a pattern by fixed thresholds, the score that decided
it, its confidence and its entropy (``attnmt heads``). Pure numpy: no model, no torch.

Letters: H heads, T query positions (rows), S key positions (columns).

A head's map for one sentence is A (T, S), each row a query's weights over the keys, summing to 1. Query i
may see the keys V(i): every key, but for decoder self-attention only j <= i (it is causal). Its own
position p(i) is i in self-attention, and in cross-attention the proportional position
p(i) = round(i (S - 1) / (T - 1)) (0 when T = 1; halves round up). Every score is a mean over query rows,
each row of each sentence weighing the same, of:

- ``diagonal``, ``previous``, ``next``: A[i, p(i) + o] for the offset o = 0, -1, +1, over the rows whose key
  p(i) + o exists and is visible;
- ``stripe``: the mass on delimiter keys, sum of A[i, j] over keys j that are BOS, EOS or punctuation (a
  piece whose characters after the word marker "▁" are all Unicode punctuation, category P*): the vertical
  stripes of Clark et al. 2019 ("What does BERT look at?");
- ``local``: the mass inside the window |j - p(i)| <= 3 (7 keys around its own position), over the rows
  whose window leaves out at least one visible key (a row whose window holds them all would score 1
  whatever the head did);
- ``block``: ``local`` above chance, (m - u) / (1 - u) per row, m its mass in the window and u the
  window's share of the visible keys (what a uniform row puts there), over the same rows: 1 when all the
  mass is in the window, 0 for a uniform row, below 0 for a head that looks away. On Multi30k's sentences
  of 10 to 20 pieces the window is a third to a half of them, so the raw mass alone would call a uniform
  head local;
- ``dispersed``: the normalised entropy, -sum A[i, j] log A[i, j] / log |V(i)|, over rows with two or more
  visible keys (1 for a uniform row, 0 for a one-hot row);
- ``confidence``: max over j of A[i, j]; ``entropy``: -sum A[i, j] log A[i, j] in nats, over every row
  (Voita et al. 2019, "Analyzing multi-head self-attention", sec. 4).

The pattern is the first rule that holds, in this order, and its score is the one the rule compared:

1. ``diagonal`` / ``previous`` / ``next``: the largest of the three offset scores >= 0.5 (ties: that order).
   0.5 because a weight above 0.5 is its row's largest: a head at 0.5 gives one relative position as much
   weight as all other keys together, on average, which is 5 to 10 times what a uniform head gives it on
   sentences of 10 to 20 pieces;
2. ``stripe``: the stripe score >= 0.5 (half the mass on delimiters, the same majority argument);
3. ``block``: the block score >= 0.5 (the window holds at least half of the mass a uniform row leaves
   outside it);
4. ``dispersed``: the normalised entropy >= 0.7;
5. otherwise ``long-range``: concentrated, and far from its own position ("sparse long-range links"); its
   score is the mass outside the window, 1 - local.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

KINDS = ("enc_self", "dec_self", "cross")
KIND_NAMES = {"enc_self": "encoder self", "dec_self": "decoder self", "cross": "cross"}
OFFSETS = {"diagonal": 0, "previous": -1, "next": 1}
PATTERNS = ("diagonal", "previous", "next", "stripe", "block", "dispersed", "long-range")

POSITIONAL_MIN = 0.5  # the best offset score
STRIPE_MIN = 0.5  # the mass on BOS, EOS and punctuation
BLOCK_MIN = 0.5  # the mass inside |j - p(i)| <= WINDOW, above chance
DISPERSED_MIN = 0.7  # the normalised entropy
WINDOW = 3
WORD_MARK = "\u2581"  # sentencepiece's word-start marker


def is_delimiter(piece: str) -> bool:
    """BOS, EOS, or a punctuation piece: every character after the word marker is Unicode punctuation."""
    if piece in ("<s>", "</s>"):
        return True
    text = piece.lstrip(WORD_MARK)
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def anchors(rows: int, cols: int, cross: bool) -> np.ndarray:
    """p(i) for each query row: i, or for cross-attention round(i (S - 1) / (T - 1)), halves up. (T,)"""
    i = np.arange(rows)
    if not cross:
        return i
    if rows == 1:
        return np.zeros(1, dtype=np.int64)
    return np.floor(i * (cols - 1) / (rows - 1) + 0.5).astype(np.int64)


@dataclass(frozen=True)
class HeadScores:
    """One head's pattern, the score that decided it, and every score (means over query rows)."""

    pattern: str
    score: float
    diagonal: float
    previous: float
    next: float
    stripe: float
    block: float  # local above chance
    local: float  # the mass in the window
    dispersed: float  # the normalised entropy
    confidence: float
    entropy: float  # nats


def classify(offsets: dict[str, float], stripe: float, block: float, dispersed: float,
             local: float) -> tuple[str, float]:
    """(pattern, deciding score) by the rules of the module docstring, in their order."""
    best = max(OFFSETS, key=lambda name: offsets[name])  # max keeps the first of equals
    if offsets[best] >= POSITIONAL_MIN:
        return best, offsets[best]
    if stripe >= STRIPE_MIN:
        return "stripe", stripe
    if block >= BLOCK_MIN:
        return "block", block
    if dispersed >= DISPERSED_MIN:
        return "dispersed", dispersed
    return "long-range", 1.0 - local


def _mean(total: np.ndarray, rows: int | np.ndarray) -> np.ndarray:
    return np.where(rows > 0, total / np.maximum(rows, 1), 0.0)


@dataclass
class Tally:
    """Sums over query rows, per head, of every score, and the rows each was taken over; ``add`` one
    sentence's maps, ``scores`` at the end."""

    heads: int
    offsets: np.ndarray = field(init=False)  # (3, H), in the order of OFFSETS
    offset_rows: np.ndarray = field(init=False)  # (3,)
    sums: dict[str, np.ndarray] = field(init=False)  # stripe, block, local, ...: (H,)
    rows: dict[str, int] = field(init=False)  # rows each of those was taken over

    def __post_init__(self) -> None:
        self.offsets = np.zeros((len(OFFSETS), self.heads))
        self.offset_rows = np.zeros(len(OFFSETS), dtype=np.int64)
        names = ("stripe", "block", "local", "dispersed", "confidence", "entropy")
        self.sums = {name: np.zeros(self.heads) for name in names}
        self.rows = dict.fromkeys(names, 0)

    def add(self, weights: np.ndarray, kind: str, delimiters: np.ndarray) -> None:
        """One sentence: ``weights`` (H, T, S) of an attention ``kind`` (``KINDS``), ``delimiters`` (S,)
        True where a key is BOS, EOS or punctuation."""
        weights = np.asarray(weights, dtype=np.float64)
        H, T, S = weights.shape
        if H != self.heads or np.shape(delimiters) != (S,):
            raise ValueError(f"maps of shape {weights.shape} and {np.shape(delimiters)} delimiter flags "
                             f"for a tally of {self.heads} heads")
        if T == 0 or S == 0:
            return
        i, j = np.arange(T), np.arange(S)
        p = anchors(T, S, kind == "cross")  # (T,)
        visible = j[None, :] <= i[:, None] if kind == "dec_self" else np.ones((T, S), dtype=bool)  # (T, S)
        n_visible = visible.sum(1)  # (T,)
        for k, offset in enumerate(OFFSETS.values()):
            key = p + offset
            ok = (key >= 0) & (key < S)
            ok[ok] = visible[i[ok], key[ok]]
            self.offsets[k] += weights[:, i[ok], key[ok]].sum(-1)
            self.offset_rows[k] += int(ok.sum())
        self._add("stripe", weights[:, :, np.asarray(delimiters, dtype=bool)].sum((-1, -2)), T)
        window = (np.abs(j[None, :] - p[:, None]) <= WINDOW) & visible  # (T, S)
        partial = window.sum(1) < n_visible  # (T,)
        mass = (weights * window)[:, partial].sum(-1)  # (H, rows with a partial window)
        share = window[partial].sum(-1) / n_visible[partial]  # what a uniform row puts there
        self._add("local", mass.sum(-1), int(partial.sum()))
        self._add("block", ((mass - share) / (1.0 - share)).sum(-1), int(partial.sum()))
        plogp = np.where(weights > 0, weights * np.log(np.where(weights > 0, weights, 1.0)), 0.0)
        entropy = -plogp.sum(-1)  # (H, T)
        several = n_visible >= 2
        self._add("dispersed", (entropy[:, several] / np.log(n_visible[several])).sum(-1), int(several.sum()))
        self._add("entropy", entropy.sum(-1), T)
        self._add("confidence", weights.max(-1).sum(-1), T)

    def _add(self, name: str, total: np.ndarray, rows: int) -> None:
        self.sums[name] += total
        self.rows[name] += rows

    def scores(self) -> list[HeadScores]:
        """Each head's means and its pattern."""
        offsets = _mean(self.offsets, self.offset_rows[:, None])  # (3, H)
        means = {name: _mean(total, self.rows[name]) for name, total in self.sums.items()}
        out = []
        for h in range(self.heads):
            by_offset = {name: float(offsets[k, h]) for k, name in enumerate(OFFSETS)}
            values = {name: float(m[h]) for name, m in means.items()}
            pattern, score = classify(by_offset, values["stripe"], values["block"], values["dispersed"],
                                      values["local"])
            out.append(HeadScores(pattern, score, **by_offset, **values))
        return out


def head_scores(maps: Iterable[np.ndarray], kind: str,
                delimiters: Iterable[np.ndarray] | None = None) -> list[HeadScores]:
    """The scores of each head of one layer over sentences: ``maps`` one (H, T, S) array per sentence,
    ``delimiters`` one (S,) array of flags per sentence (None: no delimiter anywhere)."""
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; expected one of {', '.join(KINDS)}")
    maps = [np.asarray(m) for m in maps]
    if not maps:
        raise ValueError("no maps to score")
    flags: Sequence = (list(delimiters) if delimiters is not None
                       else [np.zeros(m.shape[-1], dtype=bool) for m in maps])
    tally = Tally(maps[0].shape[0])
    for weights, flag in zip(maps, flags, strict=True):
        tally.add(weights, kind, flag)
    return tally.scores()


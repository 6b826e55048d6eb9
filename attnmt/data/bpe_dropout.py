"""BPE-dropout (Provilkov et al. 2020) over a sentencepiece BPE model, seeded: the training side's
subword regularisation for ``tokenizer.model_type: bpe`` (``subword_sampling.py``).

sentencepiece has BPE-dropout of its own (``enable_sampling``), but its draws cannot be seeded: with one
seed they differ from one process to the next, so a resumed run would train on other pieces. This is
the same segmentation written again over the model's pieces and scores, with numpy's generator:

- the normalized sentence is cut into characters, each user-defined symbol (``<2fr>``, a tag) one frozen
  symbol of its own, as sentencepiece's prefix matcher does;
- merges never cross a word's start (a run of its own from the word-start mark) or a frozen symbol;
- within a word the best merge (the highest-scored piece, the earliest merge; the leftmost on a tie) is
  made again and again, as sentencepiece encodes; with dropout each merge, when its turn comes, is
  dropped instead with probability ``alpha``, for good (its two symbols join only if one of them first
  joins another), which lengthens text as sentencepiece's own BPE-dropout does (the test's oracle);
  segmentation ends when no merge is left;
- the symbols become ids as sentencepiece's do: a piece not in the model is its UTF-8 bytes with byte
  fallback, else one ``<unk>`` for a run of unknown symbols.

With ``alpha`` 0 it is sentencepiece's own deterministic BPE encoding, piece for piece (the test's oracle).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

WORD_START = "\u2581"
WORDS = re.compile(f"{WORD_START}[^{WORD_START}]*|[^{WORD_START}]+")  # a word from its mark
NORMAL, USER_DEFINED = 1, 4  # sentencepiece's ModelProto.SentencePiece.Type


class BpeDropout:
    """The merge table of one sentencepiece BPE model: ``model`` (a ``SentencePieceProcessor``) and its
    ``ModelProto`` ``spec`` (``model_spec``; it alone tells user-defined symbols from other pieces)."""

    def __init__(self, model, spec) -> None:
        self.model = model
        self.scores: dict[str, float] = {}  # the normal pieces, each a merge's result
        self.symbols: dict[str, int] = {}  # user-defined: always one piece, never merged
        for i, piece in enumerate(spec.pieces):
            if piece.type == NORMAL:
                self.scores[piece.piece] = piece.score
            elif piece.type == USER_DEFINED:
                self.symbols[piece.piece] = i
        # The symbols, longest first: a regular expression's alternation then takes the longest that matches.
        longest_first = sorted(self.symbols, key=len, reverse=True)
        self.symbol_pattern = (re.compile(f"({'|'.join(map(re.escape, longest_first))})")
                               if longest_first else None)
        self.split_words = not any(WORD_START in piece[1:] for piece in self.scores)
        self.byte_ids = ([model.piece_to_id(f"<0x{b:02X}>") for b in range(256)]
                         if spec.trainer_spec.byte_fallback else None)
        self.merges = lru_cache(maxsize=1 << 16)(self.deterministic_merges)  # words recur (Zipf)

    def words(self, text: str) -> list[tuple[str, bool]]:
        """``text`` (normalized) in the runs that merges never cross, each with whether it is frozen: a
        user-defined symbol alone (the longest that matches, as sentencepiece's prefix matcher takes it), and
        each word from its word-start mark (sentencepiece's default, ``split_by_whitespace``, makes no piece
        with the mark inside); the text between symbols whole when the model has such a piece."""
        parts = self.symbol_pattern.split(text) if self.symbol_pattern else [text]
        runs: list[tuple[str, bool]] = []
        for k, part in enumerate(parts):
            if k % 2:
                runs.append((part, True))
            elif part:
                runs.extend((w, False) for w in (WORDS.findall(part) if self.split_words else [part]))
        return runs

    def pieces(self, text: str, alpha: float, rng: np.random.Generator | None) -> list[str]:
        """``text`` (normalized) cut into pieces by ``merge`` run by run. A run of n characters may take 4n
        draws: fewer than 4n turns each merge (n - 1 at most) or drop a pair of neighbours for good (n - 1
        at first, and each merge makes two more at most). The sentence's draws are made at once."""
        runs = self.words(text)
        draws = None
        if alpha > 0:
            draws = rng.random(sum(4 * len(w) for w, frozen in runs if not frozen and len(w) > 1)).tolist()
        out, at = [], 0
        for word, frozen in runs:
            if frozen or len(word) < 2:
                out.append(word)
            else:
                out.extend(self.merge(word, alpha, draws, at))
                at += 4 * len(word)
        return out

    def merge(self, word: str, alpha: float, draws: list[float] | None, at: int) -> list[str]:
        """One run's pieces: the best merge (highest score, leftmost) made again and again; with ``alpha``,
        each merge, when its turn comes, dropped instead when its draw (``draws`` from ``at`` on) is below
        ``alpha``, for good: its two symbols are not joined unless one of them first joins another.

        Until the first drop the turns are the deterministic encoding's merges, kept per word
        (``merges``): they are replayed, and only the turns after a drop search for their merge."""
        path, pieces = self.merges(word)
        turn = len(path) if draws is None else next(
            (t for t in range(len(path)) if draws[at + t] < alpha), len(path))
        if turn == len(path):
            return list(pieces)
        symbols, serial = list(word), list(range(len(word)))  # a name per symbol, a new one for each merge
        for fresh, i in enumerate(path[:turn], start=len(word)):
            join(symbols, serial, i, fresh)
        fresh = len(word) + turn
        dropped: set[tuple[int, int]] = set()
        while (i := self.best(symbols, serial, dropped)) is not None:
            if draws[at + turn] < alpha:
                dropped.add((serial[i], serial[i + 1]))
            else:
                join(symbols, serial, i, fresh)
                fresh += 1
            turn += 1
        return symbols

    def best(self, symbols: list[str], serial: list[int], dropped: set[tuple[int, int]]) -> int | None:
        """Where the next merge is: the neighbours whose join is the highest-scored piece, the leftmost on a
        tie, among those not ``dropped``; None when there are none."""
        best = max(((self.scores.get(a + b), -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))
                    if a + b in self.scores and (serial[i], serial[i + 1]) not in dropped), default=None)
        return None if best is None else -best[1]

    def deterministic_merges(self, word: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Where each merge of the deterministic encoding of ``word`` is made, in turn, and its pieces."""
        symbols, serial, path = list(word), list(range(len(word))), []
        while (i := self.best(symbols, serial, set())) is not None:
            join(symbols, serial, i, len(word) + len(path))
            path.append(i)
        return tuple(path), tuple(symbols)

    def ids(self, pieces: list[str]) -> list[int]:
        """sentencepiece's ids of ``pieces``: bytes for an unknown piece with byte fallback, else one
        ``<unk>`` per run of unknown pieces."""
        out: list[int] = []
        unk = self.model.unk_id()
        for piece in pieces:
            i = self.symbols.get(piece)
            if i is None:
                i = self.model.piece_to_id(piece) if piece in self.scores else unk
            if i != unk:
                out.append(i)
            elif self.byte_ids is not None:
                out.extend(self.byte_ids[b] for b in piece.encode("utf-8"))
            elif not out or out[-1] != unk:
                out.append(unk)
        return out

    def encode(self, text: str, alpha: float, seed: int | None = None) -> list[int]:
        """The ids of raw ``text``, normalized by the model, by BPE-dropout seeded with ``seed``."""
        normalized = self.model.normalize(text)
        rng = np.random.default_rng(seed) if alpha > 0 else None
        return self.ids(self.pieces(normalized, alpha, rng))



def join(symbols: list[str], serial: list[int], i: int, name: int) -> None:
    """Merge symbol ``i`` with the next, in place; the merged symbol is called ``name`` in ``serial``."""
    symbols[i:i + 2], serial[i:i + 2] = [symbols[i] + symbols[i + 1]], [name]


def model_spec(proto: bytes):
    """The serialized sentencepiece model ``proto`` read as its ``ModelProto``."""
    from sentencepiece import sentencepiece_model_pb2

    spec = sentencepiece_model_pb2.ModelProto()
    spec.ParseFromString(proto)
    return spec


def is_bpe(spec) -> bool:
    """Whether the ``ModelProto`` ``spec`` is a BPE model's."""
    return spec.trainer_spec.model_type == spec.trainer_spec.BPE

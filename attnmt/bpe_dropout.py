"""BPE-dropout (Provilkov et al. 2020) over a sentencepiece BPE model, seeded: the training side's
subword regularisation for ``tokenizer.model_type: bpe`` (``subword_sampling.py``).

sentencepiece has BPE-dropout of its own (``enable_sampling``), but its draws cannot be seeded: with one
seed they differ from one process to the next, so a resumed run would train on other pieces. This is
the same segmentation written again over the model's pieces and scores, with numpy's generator:

- the normalized sentence is cut into characters, each user-defined symbol (``<2fr>``, a tag) one frozen
  symbol of its own, as sentencepiece's prefix matcher does;
- at each step, each adjacent pair whose concatenation is a piece is a candidate merge; each candidate
  is dropped with probability ``alpha`` for this step only (the paper's rule); of those left, the
  highest-scored piece (the earliest merge) is made, the leftmost first on a tie; when every candidate
  was dropped, or none is left, segmentation ends;
- the symbols become ids as sentencepiece's do: a piece not in the model is its UTF-8 bytes with byte
  fallback, else one ``<unk>`` for a run of unknown symbols.

With ``alpha`` 0 it is sentencepiece's own deterministic BPE encoding, piece for piece (the test's oracle).
"""

from __future__ import annotations

import numpy as np

UNK_ID = 1
WORD_START = "\u2581"
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
        self.longest_symbol = max(map(len, self.symbols), default=0)
        self.split_words = not any(WORD_START in piece[1:] for piece in self.scores)
        self.byte_ids = ([model.piece_to_id(f"<0x{b:02X}>") for b in range(256)]
                         if spec.trainer_spec.byte_fallback else None)

    def characters(self, text: str) -> list[tuple[str, bool]]:
        """``text`` (normalized) as (symbol, frozen) pairs: one per character, user-defined symbols whole
        (the longest that matches)."""
        out, i = [], 0
        while i < len(text):
            for width in range(min(self.longest_symbol, len(text) - i), 0, -1):
                if text[i:i + width] in self.symbols:
                    out.append((text[i:i + width], True))
                    i += width
                    break
            else:
                out.append((text[i], False))
                i += 1
        return out

    def words(self, text: str) -> list[list[tuple[str, bool]]]:
        """``text``'s symbols (``characters``) in the runs that merges never cross: a user-defined symbol
        alone, and each word from its word-start mark (sentencepiece's default, ``split_by_whitespace``,
        makes no piece with the mark inside); one run when the model has such a piece."""
        runs: list[list[tuple[str, bool]]] = []
        for symbol, frozen in self.characters(text):
            if not runs or frozen or runs[-1][-1][1] or (symbol == WORD_START and self.split_words):
                runs.append([])
            runs[-1].append((symbol, frozen))
        return runs

    def pieces(self, text: str, alpha: float, rng: np.random.Generator | None) -> list[str]:
        """``text`` (normalized) cut into pieces by ``merge`` run by run."""
        return [piece for run in self.words(text) for piece in self.merge(run, alpha, rng)]

    def merge(self, run: list[tuple[str, bool]], alpha: float, rng: np.random.Generator | None) -> list[str]:
        """One run's pieces: the best merge (highest score, leftmost) made again and again; with ``alpha``,
        each merge, when its turn comes, dropped instead with probability ``alpha``, for good: its two
        symbols are not joined unless one of them first joins another."""
        symbols = [s for s, _ in run]
        if len(symbols) < 2 or run[0][1]:
            return symbols
        serial = list(range(len(symbols)))  # a name for each symbol, a new one for each merge's result
        dropped: set[tuple[int, int]] = set()
        # A turn merges (n - 1 at most) or drops a pair of neighbours for good (n - 1 at first, and each
        # merge makes two more at most): fewer than 4n turns, each drawing one number.
        draws = rng.random(4 * len(symbols)) if alpha > 0 else None
        turn, fresh = 0, len(symbols)
        while True:
            best = max(((self.scores.get(a + b), -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))
                        if a + b in self.scores and (serial[i], serial[i + 1]) not in dropped), default=None)
            if best is None:
                return symbols
            i = -best[1]
            if draws is not None and draws[turn] < alpha:
                dropped.add((serial[i], serial[i + 1]))
            else:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                serial[i:i + 2] = [fresh]
                fresh += 1
            turn += 1

    def ids(self, pieces: list[str]) -> list[int]:
        """sentencepiece's ids of ``pieces``: bytes for an unknown piece with byte fallback, else one
        ``<unk>`` per run of unknown pieces."""
        out: list[int] = []
        for piece in pieces:
            i = self.symbols.get(piece)
            if i is None:
                i = self.model.piece_to_id(piece) if piece in self.scores else UNK_ID
            if i != UNK_ID:
                out.append(i)
            elif self.byte_ids is not None:
                out.extend(self.byte_ids[b] for b in piece.encode("utf-8"))
            elif not out or out[-1] != UNK_ID:
                out.append(UNK_ID)
        return out

    def encode(self, text: str, alpha: float, seed: int | None = None) -> list[int]:
        """The ids of raw ``text``, normalized by the model, by BPE-dropout seeded with ``seed``."""
        normalized = self.model.normalize(text)
        rng = np.random.default_rng(seed) if alpha > 0 else None
        return self.ids(self.pieces(normalized, alpha, rng))



def model_spec(proto: bytes):
    """The serialized sentencepiece model ``proto`` read as its ``ModelProto``."""
    from sentencepiece import sentencepiece_model_pb2

    spec = sentencepiece_model_pb2.ModelProto()
    spec.ParseFromString(proto)
    return spec


def is_bpe(spec) -> bool:
    """Whether the ``ModelProto`` ``spec`` is a BPE model's."""
    return spec.trainer_spec.model_type == spec.trainer_spec.BPE

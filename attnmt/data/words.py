"""Pieces and words: what a word is in a line of text, which of a model's pieces make it up, attention
over pieces merged into attention over words (``plot --words``, ``align``), and a word's probability
from its pieces' (``word_scores``).

Letters: T query positions, S key positions, P pieces, W words.

A word receives the attention its pieces receive (key pieces summed), and a word's own attention is the
mean over its pieces (query pieces averaged), so every row still sums to what it did. In text with spaces
between words, sentencepiece marks a piece that begins a word with "▁", and a word is the pieces from one
mark to the next (``word_groups``, a partition). Chinese and Japanese are written without spaces, so:

- text that is pre-segmented (a space next to a CJK character, as alignment gold standards are) is taken
  as given: its words are its space-separated tokens;
- unsegmented CJK text falls back to characters: each CJK character is a word (and each run of other
  characters, such as a name in Latin letters, is one).

A model reads unsegmented text (it was trained on it), so for CJK lines the model's pieces come from the
line with the spaces next to CJK characters taken out, and a piece that spans several words (a piece of
two characters, with character words) shares its attention among them in proportion to its characters: a
membership matrix (P, W) whose rows sum to 1 instead of a partition. UTF-8 byte pieces (``<0xE4>``: a
character the vocabulary lacks, with ``tokenizer.byte_fallback``) belong to the character they spell.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..config.languages import is_cjk_char
from .readers import clean
from .tokenizer import UNK_ID

WORD_START = "\u2581"  # sentencepiece's mark of a piece that begins a word
SENTENCE_MARKS = frozenset({"<s>", "</s>", "<pad>"})
"""Labels of the positions a model adds around a sentence: each one a word of its own."""
_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

Groups = list[list[int]]  # the piece positions of each word, in order: a partition of the pieces
Pieces = Groups | np.ndarray  # groups, or a membership matrix (P, W) whose rows sum to 1


# --------------------------------------------------------------------------------- spaced text


def word_groups(pieces: Sequence[str]) -> Groups:
    """Positions of the pieces of each word: a piece starting with "▁" starts a word, ``<s>``/``</s>`` are
    words of their own, any other piece continues the word before it."""
    groups: Groups = []
    open_word = False
    for k, piece in enumerate(pieces):
        if piece in SENTENCE_MARKS:
            groups.append([k])
            open_word = False
        elif piece.startswith(WORD_START) or not open_word:
            groups.append([k])
            open_word = True
        else:
            groups[-1].append(k)
    return groups


def word_labels(pieces: Sequence[str], groups: Sequence[Sequence[int]]) -> list[str]:
    return ["".join(pieces[k] for k in g).replace(WORD_START, "") or WORD_START for g in groups]


def merge_groups(weights: np.ndarray, row_groups: Sequence[Sequence[int]],
                 col_groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(..., T, S) -> (..., rows, cols): the columns (keys) of a group summed, so a word receives the
    attention its pieces receive; the rows (queries) of a group averaged, so every row still sums to
    what it summed to before. Groups are consecutive positions covering the axis in order."""
    weights = np.asarray(weights, dtype=np.float64)
    col_starts = [g[0] for g in col_groups]
    row_starts = [g[0] for g in row_groups]
    summed = np.add.reduceat(weights, col_starts, axis=-1) if col_starts else weights[..., :0]
    if not row_starts:
        return summed[..., :0, :]
    sizes = np.array([len(g) for g in row_groups], dtype=np.float64)
    return np.add.reduceat(summed, row_starts, axis=-2) / sizes[:, None]


def membership_of(groups: Pieces, n_pieces: int) -> np.ndarray:
    """A partition as a membership matrix (P, W) of zeros and ones; a membership matrix as it is."""
    if isinstance(groups, np.ndarray):
        return groups
    matrix = np.zeros((n_pieces, len(groups)))
    for w, group in enumerate(groups):
        matrix[list(group), w] = 1.0
    return matrix


def merge(weights: np.ndarray, rows: Pieces, cols: Pieces) -> np.ndarray:
    """(..., T, S) -> (..., row words, column words) for groups or membership matrices: columns summed with
    each piece's share, rows averaged with it (``merge_groups`` exactly, when both are groups)."""
    weights = np.asarray(weights, dtype=np.float64)
    if not isinstance(rows, np.ndarray) and not isinstance(cols, np.ndarray):
        return merge_groups(weights, rows, cols)
    rows, cols = membership_of(rows, weights.shape[-2]), membership_of(cols, weights.shape[-1])
    summed = weights @ cols  # (..., T, Ws)
    share = rows.sum(0)  # (Wt,) how many pieces' worth each row word holds
    return np.swapaxes(np.swapaxes(summed, -1, -2) @ rows, -1, -2) / np.where(share > 0, share, 1)[:, None]


# ----------------------------------------------------------------------------------- CJK text


@dataclass(frozen=True)
class Word:
    text: str
    space_before: bool  # in the text the model reads, a space separates it from the word before


def has_cjk(text: str) -> bool:
    return any(is_cjk_char(c) for c in text)


def segment(line: str) -> list[Word]:
    """The words of a line: its space-separated tokens when it is pre-segmented (a space next to a CJK
    character) or has no CJK at all, else each CJK character and each run of other characters.
    ``space_before`` drops the spaces next to CJK characters: the model reads unsegmented text."""
    tokens = clean(line).split()
    pre_segmented = any(is_cjk_char(a[-1]) or is_cjk_char(b[0]) for a, b in zip(tokens, tokens[1:]))
    words: list[Word] = []
    for token in tokens:
        for k, part in enumerate([token] if pre_segmented else _split_cjk(token)):
            if not words or k > 0:  # the first word, or one cut out of a token: no space before it
                words.append(Word(part, False))
            else:
                words.append(Word(part, not (is_cjk_char(words[-1].text[-1]) or is_cjk_char(part[0]))))
    return words


def _split_cjk(token: str) -> list[str]:
    """A token of unsegmented text: each CJK character on its own, each run of other characters together."""
    out: list[str] = []
    for char in token:
        if out and not is_cjk_char(char) and not is_cjk_char(out[-1][-1]):
            out[-1] += char
        else:
            out.append(char)
    return out


def model_text(words: Sequence[Word]) -> str:
    """The text the model reads for these words."""
    return "".join((" " if w.space_before else "") + w.text for w in words)


@dataclass
class _Char:
    text: str  # one character, or a sentence mark (<s>, </s>)
    pieces: list[int]  # the pieces that spell it (several for a character in UTF-8 byte pieces)
    after_space: bool  # a "▁" comes right before it
    mark: bool = False


def _chars(pieces: Sequence[str]) -> tuple[list[_Char], dict[int, int]]:
    """The characters the pieces spell, in order, and for each piece that spells none (a lone "▁") the
    index of the character it goes with (the next one, else the last)."""
    chars: list[_Char] = []
    orphans: list[int] = []
    pending_bytes: list[tuple[int, int]] = []  # (byte, piece)
    space = False

    def flush_bytes(complete_only: bool) -> None:
        nonlocal space
        data = bytes(b for b, _ in pending_bytes)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            if complete_only and len(data) < 4:
                return  # a character's remaining bytes are still to come
            text = "\ufffd"
        chars.append(_Char(text[:1] or "\ufffd", [k for _, k in pending_bytes], space))
        pending_bytes.clear()
        space = False

    for k, piece in enumerate(pieces):
        byte = _BYTE.match(piece)
        if byte:
            pending_bytes.append((int(byte.group(1), 16), k))
            flush_bytes(complete_only=True)
            continue
        if pending_bytes:
            flush_bytes(complete_only=False)
        if piece in SENTENCE_MARKS:
            chars.append(_Char(piece, [k], True, mark=True))
            continue
        spelled = False
        for char in piece:
            if char == WORD_START:
                space = True
            else:
                chars.append(_Char(char, [k], space))
                space, spelled = False, True
        if not spelled:
            orphans.append(k)
    if pending_bytes:
        flush_bytes(complete_only=False)
    after = {}
    for k in orphans:
        later = next((i for i, c in enumerate(chars) if min(c.pieces) > k), len(chars) - 1)
        after[k] = max(later, 0)
    return chars, after


def _membership(n_pieces: int, chars: list[_Char], orphans: dict[int, int], owner: list[int],
                n_words: int) -> np.ndarray:
    """(P, W): each piece's characters counted in the words that own them (``owner``: word of each
    character), rows normalised to sum to 1."""
    matrix = np.zeros((n_pieces, max(n_words, 1)))
    for c, char in enumerate(chars):
        for k in char.pieces:
            matrix[k, owner[c]] += 1.0
    for k, c in orphans.items():
        if chars:
            matrix[k, owner[c]] += 1.0
    totals = matrix.sum(1, keepdims=True)
    return matrix / np.where(totals > 0, totals, 1)


def piece_words(pieces: Sequence[str]) -> tuple[Pieces, list[str]]:
    """The words of a piece sequence (``plot --words``) and their labels: ``word_groups`` for text without
    CJK characters; for CJK text, a membership matrix over the words of ``segment``'s rule (pre-segmented
    text by its "▁" marks, unsegmented text by characters), with ``<s>``/``</s>`` words of their own."""
    if not any(has_cjk(p) for p in pieces):
        groups = word_groups(pieces)
        return groups, word_labels(pieces, groups)
    chars, orphans = _chars(pieces)
    # Pre-segmented: a "▁" (a space in the text) next to a CJK character, between two characters.
    segmented = any(c.after_space and i > 0 and not c.mark and not chars[i - 1].mark
                    and (is_cjk_char(c.text) or is_cjk_char(chars[i - 1].text)) for i, c in enumerate(chars))
    owner: list[int] = []
    labels: list[str] = []
    for i, char in enumerate(chars):
        previous = chars[i - 1] if i else None
        new_word = (previous is None or char.mark or previous.mark or char.after_space
                    or (not segmented and (is_cjk_char(char.text) or is_cjk_char(previous.text))))
        if new_word:
            labels.append("")
        labels[-1] += char.text
        owner.append(len(labels) - 1)
    return _membership(len(pieces), chars, orphans, owner, len(labels)), labels


def merge_words(weights: np.ndarray, row_pieces: Sequence[str],
                col_pieces: Sequence[str]) -> tuple[np.ndarray, list[str], list[str]]:
    """Attention over pieces -> attention over words (``plot --words``): key pieces of a word summed,
    query pieces averaged (``piece_words``, ``merge``). Returns (weights, row words, column words)."""
    rows, row_labels = piece_words(row_pieces)
    cols, col_labels = piece_words(col_pieces)
    return merge(weights, rows, cols), row_labels, col_labels


def words_to_pieces(encode: Callable[[list[str]], list[list[int]]], lines: Sequence[str],
                    to_pieces: Callable[[list[int]], list[str]] | None = None,
                    normalize: Callable[[str], str] | None = None,
                    ) -> tuple[list[list[int]], list[Pieces]]:
    """Lines -> (piece ids of each line, the pieces of each word: groups or a membership matrix).

    A line without CJK characters is read as pre-tokenised (words split on spaces) and its words are
    encoded one by one, so a word's pieces are exactly its own; a word that encodes to nothing (say, a lone
    zero-width space) gets the unknown piece, so every word keeps its index. A line with CJK characters
    (given ``to_pieces``) has the words of ``segment``, and is encoded whole, as the model reads it;
    ``normalize`` is the tokenizer's own normalization (default NFKC, sentencepiece's), which says how many
    of the pieces' characters each word spells."""
    ids: list[list[int]] = [[] for _ in lines]
    specs: list[Pieces] = [[] for _ in lines]
    spaced = [i for i, line in enumerate(lines) if to_pieces is None or not has_cjk(line)]
    words = {i: clean(lines[i]).split() for i in spaced}
    flat = [w for i in spaced for w in words[i]]
    encoded = iter(encode(flat) if flat else [])
    for i in spaced:
        for _ in words[i]:
            pieces = next(encoded) or [UNK_ID]
            specs[i].append(list(range(len(ids[i]), len(ids[i]) + len(pieces))))
            ids[i].extend(pieces)
    spaced_set = set(spaced)
    others = [i for i in range(len(lines)) if i not in spaced_set]
    line_words = {i: segment(lines[i]) for i in others}
    for i, line_ids in zip(others, encode([model_text(line_words[i]) for i in others]) if others else []):
        ids[i] = line_ids
        specs[i] = _word_membership(to_pieces(line_ids), line_words[i], normalize)
    return ids, specs


def _word_membership(pieces: list[str], words: list[Word],
                     normalize: Callable[[str], str] | None = None) -> np.ndarray:
    """(P, W) for pieces of ``model_text(words)``: characters are matched in order, each word owning the
    characters of its normalized form (sentencepiece's default, NFKC, turns full-width punctuation into
    ASCII)."""
    normalize = normalize or (lambda text: unicodedata.normalize("NFKC", text))
    owner_of_position = [w for w, word in enumerate(words) for _ in normalize(word.text)]
    chars, orphans = _chars(pieces)
    last = max(len(words) - 1, 0)
    owner = [owner_of_position[c] if c < len(owner_of_position) else last for c in range(len(chars))]
    return _membership(len(pieces), chars, orphans, owner, len(words))


def word_count(spec: Pieces) -> int:
    return spec.shape[1] if isinstance(spec, np.ndarray) else len(spec)


# --------------------------------------------------------------------------------- word confidence
#
# ``translate --scores words`` and ``score --words``: a word's log-probability is the sum of its pieces'
# (the chain rule: the probability that the model writes exactly those pieces, one after another), so
# its probability is the exponent of that sum, and the product of every word's and the end's is the
# whole output's. Pieces become words as above; in CJK text a piece shared by several character words
# gives each the share of its log-probability that its characters are of the piece.


@dataclass(frozen=True)
class WordScores:
    """One output's words, each with its probability, and the probability of its end (EOS)."""

    words: list[tuple[str, float]]
    end: float

    def as_json(self) -> dict:
        """Probabilities to 6 significant digits (a rare word's 1e-9 is not 0)."""
        return {"words": [{"word": w, "prob": float(f"{p:.6g}")} for w, p in self.words],
                "end": float(f"{self.end:.6g}")}


def word_scores(pieces: Sequence[str], logprobs: Sequence[float]) -> WordScores:
    """``pieces`` (the output's, without EOS) and ``logprobs`` (one per piece, then EOS's) -> its words'
    probabilities and its end's."""
    if len(logprobs) != len(pieces) + 1:
        raise ValueError(f"{len(logprobs)} log-probabilities for {len(pieces)} pieces and the end")
    if not pieces:
        return WordScores([], float(np.exp(logprobs[-1])))
    found, labels = piece_words(pieces)
    piece_logp = np.asarray(logprobs[:-1], dtype=np.float64)
    if isinstance(found, np.ndarray):  # a membership matrix (P, W) whose rows sum to 1
        word_logp = piece_logp @ found
    else:
        word_logp = np.array([piece_logp[group].sum() for group in found])
    return WordScores([(label, float(np.exp(lp))) for label, lp in zip(labels, word_logp)],
                      float(np.exp(logprobs[-1])))

"""Guided alignment training (Garg et al. 2019): the word alignments of the training corpus, checked
against it and turned into the (target piece, source piece) links that chosen cross-attention heads learn.

A Pharaoh line ``i-j`` links source word i to target word j; possible links (``i?j``, ``ipj``) are read
and checked but not taught: a head taught a sure and a possible link of one word splits its attention
evenly between them (on the toy task the argmax then lands on the possible link about half the time).
Words are what ``words.piece_words`` makes of a pair's pieces: the space-separated tokens, or for CJK
text without spaces its characters (so an alignment file of unsegmented Chinese counts characters of the
text as trained, not the words of a segmented copy); a spaced pair whose pieces make another number of
words than its spaces is left without links, and counted, rather than linked to shifted words. Pairs that
cleaning or the length filter dropped keep their line in the file (the file follows the corpus as read), so
each kept pair takes the line it was read from. Every piece of the source word is linked with every piece
of the target word; the loss (``loss.guided_alignment_loss``) spreads a target piece's attention evenly
over its links.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.schema import GuidedAlignmentConfig
from ..data.batching import EncodedSplit
from ..data.readers import read_lines
from ..data.tokenizer import Tokenizer
from ..data.words import has_cjk, membership_of, piece_words
from ..errors import DataError
from ..insight.links import parse_pharaoh


def _membership(pieces: list[str]) -> np.ndarray:
    return membership_of(piece_words(pieces)[0], len(pieces))


def read_alignment_lines(guided: GuidedAlignmentConfig, split: EncodedSplit, corpus_lines: int,
                         corpus: str) -> tuple[str, list[str]]:
    """(where, one Pharaoh line per pair of ``split``): from ``guided.path``, which must have as many lines
    as the training corpus had (``corpus_lines``, ``corpus`` names it), or the toy task's own."""
    if guided.path is None:
        if split.gold is None:
            raise DataError("train.alignment: no path given and the prepared training data has no "
                            "alignments of its own (only the toy task has)")
        return "the toy task's alignments", list(split.gold)
    if split.lines is None:
        raise DataError(f"train.alignment: {guided.path}: this run folder was prepared by an older attnmt, "
                        "which did not keep the corpus line of each pair; use another --run-dir")
    path = Path(guided.path)
    file_lines = list(read_lines(path))
    if len(file_lines) != corpus_lines:
        raise DataError(f"{path}: {len(file_lines)} lines, but the training corpus ({corpus}) has "
                        f"{corpus_lines}: an alignment file has one line per line of the corpus")
    return str(path), [file_lines[line - 1] for line in split.lines.tolist()]


@dataclass
class PieceAlignments:
    links: list[np.ndarray]  # per pair: (n, 2) (target piece, source piece) links
    skipped: int = 0  # pairs left without links: their pieces make other words than their spaces
    first_skipped: int | None = None  # the corpus line of the first of them


def _words_differ(text: str | None, pieces_words: int) -> bool:
    """Spaced text whose pieces make another number of words than its spaces do (a character that
    sentencepiece's normalization removes, such as U+FEFF, or expands, such as U+FDFA): its word indices
    cannot be trusted. CJK text is counted by characters (``words.piece_words``) and not checked."""
    return text is not None and not has_cjk(text) and len(text.split()) != pieces_words


def piece_alignments(guided: GuidedAlignmentConfig, split: EncodedSplit, tokenizer: Tokenizer,
                     corpus_lines: int, corpus: str) -> PieceAlignments:
    """Per pair of ``split``: an (n, 2) array of (target piece, source piece) links. A malformed link or
    one outside its pair is a DataError naming the file and line; a pair whose pieces make other words
    than its spaces (with ``split.src_text`` known) gets no links and is counted. For an alignment layer
    (``module: layer``), a target word with possible links and no sure one is taught its possible links
    (the toy's "uhr", possibly "pm"), and each piece of a target word with neither, in a pair that has
    links, is linked to the source's EOS: the layer's null word, which ``align`` reads as no link."""
    where, texts = read_alignment_lines(guided, split, corpus_lines, corpus)
    numbers = split.lines.tolist() if split.lines is not None else list(range(1, len(texts) + 1))
    out = PieceAlignments([])
    for k, text in enumerate(texts):
        try:
            links, possible = parse_pharaoh(text, guided.one_based)
        except ValueError as e:
            raise DataError(f"{where}:{numbers[k]}: {e}") from None
        if not possible:
            out.links.append(np.zeros((0, 2), dtype=np.int64))
            continue
        src = _membership(tokenizer.src_pieces(split.src_ids[k])) > 0  # (P, W)
        tgt = _membership(tokenizer.tgt_pieces(split.tgt_ids[k])) > 0
        outside = sorted((i, j) for i, j in possible if i >= src.shape[1] or j >= tgt.shape[1])
        if outside:
            i, j = outside[0]
            shift = 1 if guided.one_based else 0
            raise DataError(f"{where}:{numbers[k]}: link {i + shift}-{j + shift} is outside the pair "
                            f"({src.shape[1]} source words, {tgt.shape[1]} target words)")
        if (_words_differ(split.src_text[k] if split.src_text else None, src.shape[1])
                or _words_differ(split.tgt_text[k], tgt.shape[1])):
            out.links.append(np.zeros((0, 2), dtype=np.int64))
            out.skipped += 1
            out.first_skipped = out.first_skipped or numbers[k]
            continue
        if guided.module == "layer":  # a target word linked only possibly is taught its possible links
            sure_targets = {j for _, j in links}
            links = links | {(i, j) for i, j in possible if j not in sure_targets}
        pairs = {(int(q), int(p)) for i, j in links
                 for q in np.flatnonzero(tgt[:, j]) for p in np.flatnonzero(src[:, i])}
        if guided.module == "layer" and links:
            covered = {j for _, j in possible}
            pairs |= {(int(q), src.shape[0]) for j in range(tgt.shape[1]) if j not in covered
                      for q in np.flatnonzero(tgt[:, j])}
        out.links.append(np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2))
    return out

"""Word alignments of sentence pairs from a model's attention (``attnmt align``): the words of each line
and their pieces, the links read off the cross-attention or the alignment layer (``links.py``'s
extraction), both directions symmetrized, ``align --calibrate``'s search for the layer and heads that align
best, and markup carried through translation on those links (``carry_markup``: ``translate --markup``).

Letters: T target positions, S source positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.markup import MarkedText, place_tags
from ..data.words import Pieces, membership_of, merge, segment, word_count, words_to_pieces
from ..decoding.translator import Translator
from ..errors import DataError
from .alti import alti_pairs
from .attention_maps import teacher_forced_attention
from .attribution import attribute_pairs
from .links import (
    AlignOptions,
    Gold,
    Link,
    alignment_scores,
    attention_rows,
    extract_alignment,
    parse_pharaoh,
    read_calibration,
    symmetrize,
    words_from_piece_links,
)


def default_align_options(cfg, checkpoint: Path | None = None) -> AlignOptions:
    """How ``align`` reads a model by default: its alignment layer if it has one, else the layer and heads
    ``align --calibrate`` chose for its run (``read_calibration``), else for a model trained with
    ``train.alignment`` the layer and heads it taught, else every layer and head averaged; the mutual
    argmax."""
    guided = cfg.train.alignment
    if guided is not None and guided.module == "layer":
        return AlignOptions(kind="align", null=guided.objective == "links")
    calibrated = read_calibration(checkpoint) if checkpoint is not None else None
    full_context = guided is not None and guided.full_context
    if calibrated is not None:
        return AlignOptions(*calibrated, full_context=full_context)
    if guided is None:
        return AlignOptions()
    return AlignOptions(guided.layer - 1, tuple(h - 1 for h in guided.heads), full_context=full_context)


def dev_aer(translator: Translator, sources: Sequence[str], targets: Sequence[str], gold_lines: Sequence[str],
            options: AlignOptions) -> float:
    """The AER of ``align`` on sentence pairs with gold Pharaoh lines (validation on the toy task)."""
    sure, possible = zip(*(parse_pharaoh(line) for line in gold_lines))
    gold = Gold(Path("dev gold"), list(sure), list(possible))
    links = align_corpus(translator, sources, targets, options, gold).links
    return alignment_scores(links, gold.sure, gold.possible).aer


@dataclass
class Aligned:
    targets: list[str]  # the target sentences aligned with (given, or the model's translations)
    links: list[list[Link]]  # per pair: (source word, target word) links, sorted


def align_corpus(translator: Translator, sources: Sequence[str], targets: Sequence[str] | None = None,
                 options: AlignOptions = AlignOptions(), gold: Gold | None = None,
                 reverse: Translator | None = None,
                 reverse_options: AlignOptions | None = None,
                 on_batch: Callable[[int], None] | None = None) -> Aligned:
    """Word alignments of sentence pairs from cross-attention under teacher forcing (``options``: the layer
    and heads averaged, the rows, the method; ``alignment.attention_rows``), merged into words
    (``words.merge``). Words are the space-separated tokens of a line (pre-tokenised text, as gold
    standards are), or for unsegmented CJK text its characters (``words.segment``). Without ``targets`` each
    source is aligned with the model's own translation. With ``reverse``, a model trained in the other
    direction aligns each target with its source too (read with ``reverse_options``, default ``options``),
    and the two are symmetrized (``options.symmetrize``).
    ``gold`` must fit the pairs (checked before any attention is computed)."""
    if targets is None:
        targets = translator.best(sources)
    links = _directional_links(translator, sources, targets, options, gold, on_batch)
    if reverse is not None:
        backward = _directional_links(reverse, targets, sources, reverse_options or options, None, on_batch)
        links = [sorted(symmetrize(forward, [(i, j) for j, i in back], options.symmetrize))
                 for forward, back in zip(links, backward)]
    return Aligned(list(targets), links)


def word_pieces(translator: Translator, sources: Sequence[str], targets: Sequence[str], gold: Gold | None):
    """(source ids, source words' pieces, target ids, target words' pieces) of sentence pairs, read as
    ``align`` reads them (``words.words_to_pieces``), the sources after the translator's ``source_prefix``
    (pieces of no word); ``gold`` checked against the word counts."""
    tokenizer = translator.tokenizer
    src_ids, src_groups = words_to_pieces(tokenizer.encode_src, sources, tokenizer.src_pieces,
                                          tokenizer.normalize_src)
    if translator.source_prefix:  # a multilingual model reads its language token first, in no word
        prefix = tokenizer.encode_src([translator.source_prefix])[0]
        src_ids = [prefix + ids if ids else ids for ids in src_ids]
        src_groups = [after(groups, len(prefix)) if ids else groups
                      for ids, groups in zip(src_ids, src_groups)]
    tgt_ids, tgt_groups = words_to_pieces(tokenizer.encode_tgt, targets, tokenizer.tgt_pieces,
                                          tokenizer.normalize_tgt)
    if gold is not None:
        gold.check_fits([word_count(g) for g in src_groups], [word_count(g) for g in tgt_groups])
    return src_ids, src_groups, tgt_ids, tgt_groups


def after(groups: Pieces, n: int) -> Pieces:
    """Word pieces with ``n`` pieces before them that belong to no word."""
    if isinstance(groups, np.ndarray):
        return np.vstack([np.zeros((n, groups.shape[1])), groups])
    return [[k + n for k in group] for group in groups]


def read_links(cross: list[np.ndarray], src_groups, tgt_groups, options: AlignOptions) -> list[Link]:
    """Word links of one pair from its attention (one (H, T + 1, S + 1) array per layer) as ``options`` read
    it. The alignment layer (kind ``align``) keeps the source's EOS as its null word (it is taught to look
    there for a target word its links leave unlinked): a target word it links to EOS is linked to nothing,
    instead of its row being renormalised over the words onto one of them (unless it learnt by prediction:
    ``options.null``)."""
    if options.kind != "align" or not options.null:
        where = (options.layer, options.heads) if options.kind != "align" else (0, None)
        matrix = attention_rows(cross, *where, options.shift)  # (T, S)
        return _links_of(matrix, src_groups, tgt_groups, options)
    matrix = cross[0][0][:-1]  # (T, S + 1): the EOS prediction is no row
    n_src = matrix.shape[1] - 1
    if isinstance(src_groups, np.ndarray):
        null = np.zeros((n_src + 1, src_groups.shape[1] + 1))
        null[: src_groups.shape[0], : src_groups.shape[1]] = src_groups
        null[n_src, -1] = 1.0
        n_words = src_groups.shape[1]
    else:
        null, n_words = [*src_groups, [n_src]], len(src_groups)
    return [(i, j) for i, j in _links_of(matrix, null, tgt_groups, options) if i < n_words]


def _links_of(matrix: np.ndarray, src_groups, tgt_groups, options: AlignOptions) -> list[Link]:
    if options.words == "any":  # links between pieces; words linked if any of their pieces are
        pieces = extract_alignment(matrix, options.method, options.threshold)
        return words_from_piece_links(pieces, membership_of(src_groups, matrix.shape[1]),
                                      membership_of(tgt_groups, matrix.shape[0]))
    words = merge(matrix, tgt_groups, src_groups)  # (target words, source words)
    return extract_alignment(words, options.method, options.threshold)


def _cross(translator: Translator, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
           source: str = "attention", steps: int = 64,
           on_batch: Callable[[int], None] | None = None,
           full_context: bool = False, kind: str = "cross") -> list[list[np.ndarray]]:
    """Per pair, what links are read from: the cross-attention (one (H, T, S) array per layer; of the
    full-context pass with ``full_context``), the alignment layer's (``kind`` align: one layer of one head)
    or, for a gradient method (``attribution.GRADIENT_METHODS``) or ALTI+ (``alti``), its source shares as
    one layer of one head."""
    if source == "attention":
        maps = teacher_forced_attention(translator.model, src_ids, tgt_ids, translator.device,
                                        translator.decode.max_tokens, [kind], on_batch, full_context)
        return [pair_maps[kind] for pair_maps in maps]
    if source == "alti":
        found = alti_pairs(translator.model, src_ids, tgt_ids, translator.device, on_batch)
    else:
        found = attribute_pairs(translator.model, src_ids, tgt_ids, source, translator.device, steps,
                                translator.decode.max_tokens, on_batch)
    return [[a.source[None]] for a in found]


def _directional_links(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                       options: AlignOptions, gold: Gold | None,
                       on_batch: Callable[[int], None] | None = None) -> list[list[Link]]:
    src_ids, src_groups, tgt_ids, tgt_groups = word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    cross = _cross(translator, [src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs], options.source,
                   options.steps, on_batch, options.full_context, options.kind)
    links: list[list[Link]] = [[] for _ in sources]
    for i, pair_cross in zip(pairs, cross):
        links[i] = read_links(pair_cross, src_groups[i], tgt_groups[i], options)
    return links


# ---------------------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    """``align --calibrate``: the reading with the lowest AER on a dev set with gold alignments."""

    layer: int | None  # 0-based; None: every layer
    heads: tuple[int, ...] | None  # 0-based; None: every head
    aer: float
    candidates: list[tuple[int | None, tuple[int, ...] | None, float]]  # every reading tried, best first


def _readings(n_layers: int, n_heads: int, head_aer: dict[tuple[int, int], float]):
    """The readings ``calibrate`` tries: every layer and head averaged, each layer's heads averaged, each
    single head, and in each layer its k best heads (by their own AER) averaged, for k = 2 .. H - 1."""
    yield None, None
    for layer in range(n_layers):
        yield layer, None
        ranked = sorted(range(n_heads), key=lambda h: (head_aer[layer, h], h))
        for k in range(2, n_heads):
            yield layer, tuple(sorted(ranked[:k]))


def calibrate(translator: Translator, sources: Sequence[str], targets: Sequence[str], gold: Gold,
              options: AlignOptions = AlignOptions()) -> Calibration:
    """The layer and heads whose averaged cross-attention aligns ``sources`` with ``targets`` at the lowest
    AER against ``gold`` (``options`` give the rest of the reading: rows, method, words); ties go to the
    reading tried first (the coarser one). The attention is computed once; each reading is numpy only."""
    src_ids, src_groups, tgt_ids, tgt_groups = word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    cross = _cross(translator, [src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs],
                   full_context=options.full_context)
    if not cross:
        raise DataError("no sentence pairs to calibrate on (every line is empty)")
    n_layers, n_heads = len(cross[0]), cross[0][0].shape[0]

    def aer(layer: int | None, heads: tuple[int, ...] | None) -> float:
        reading = dataclasses.replace(options, layer=layer, heads=heads)
        links: list[list[Link]] = [[] for _ in sources]
        for i, pair_cross in zip(pairs, cross):
            links[i] = read_links(pair_cross, src_groups[i], tgt_groups[i], reading)
        return alignment_scores(links, gold.sure, gold.possible).aer

    head_aer = {(layer, h): aer(layer, (h,)) for layer in range(n_layers) for h in range(n_heads)}
    tried = [(layer, heads, aer(layer, heads)) for layer, heads in _readings(n_layers, n_heads, head_aer)]
    tried += [(layer, (h,), value) for (layer, h), value in head_aer.items()]
    ranked = sorted(enumerate(tried), key=lambda item: (item[1][2], item[0]))
    best = ranked[0][1]
    return Calibration(best[0], best[1], best[2], [entry for _, entry in ranked])

# ------------------------------------------------------------------------------- markup carried over
#
# Tags carried through a translation on a model's own word links (``translate --markup``, the server's
# ``"markup": true``): each translation is aligned with its source text as ``attnmt align`` aligns a pair
# (``align_corpus``), the links grown into words both sides left unlinked (``grow_unlinked``), and
# ``data.markup.place_tags`` puts the source's tags back around the linked target words. LSTM or
# Transformer alike: the links come from whatever attention the model has.

# Moses's corners of a link (the last four of ``links._NEIGHBOURS``): a side shares one of its words.
_CORNERS = ((-1, -1), (-1, 1), (1, -1), (1, 1))


def carry_markup(translator: Translator, marked: Sequence[MarkedText], translations: Sequence[str],
                 options: AlignOptions | None = None) -> list[str]:
    """Each translation (of ``marked[k].text``) as markup, with ``marked[k]``'s tags put back. ``options``:
    how links are read off the model; the commands pass its default reading
    (``reading.default_align_options(cfg, checkpoint)``, as ``align`` reads it); None: every layer and head
    averaged, the mutual argmax. Sources without tags are only escaped: they cost no alignment pass."""
    if len(marked) != len(translations):
        raise ValueError(f"{len(marked)} marked sources but {len(translations)} translations")
    tagged = [k for k, source in enumerate(marked) if source.tags]
    links: list[list[Link]] = [[] for _ in marked]
    if tagged:
        sources, targets = [marked[k].text for k in tagged], [translations[k] for k in tagged]
        reading = options or AlignOptions()
        aligned = align_corpus(translator, sources, targets, reading)
        for k, source, target, pair_links in zip(tagged, sources, targets, aligned.links):
            if reading.kind != "align":  # an alignment layer leaves words unlinked on purpose
                pair_links = grow_unlinked(pair_links, len(segment(source)), len(segment(target)))
            links[k] = pair_links
    return [place_tags(source, text, pair_links)
            for source, text, pair_links in zip(marked, translations, links)]


def grow_unlinked(links: Sequence[Link], n_src: int, n_tgt: int) -> list[Link]:
    """``links`` (between ``n_src`` source and ``n_tgt`` target words) and, until nothing changes, each
    pair of a source and a target word, both unlinked, at a corner of a link (the word before or after it
    on both sides): ``grow-diag``'s step (``links.symmetrize``, Koehn et al. 2005) into unlinked words
    only. The mutual argmax leaves unlinked on both sides what two words say together ("7:05 pm" ->
    "19:05 uhr": pm and uhr); grown, a tag around "7:05 pm" goes around "19:05 uhr". Sorted."""
    found = set(links)
    src_linked, tgt_linked = {i for i, _ in found}, {j for _, j in found}
    grew = True
    while grew:
        grew = False
        for i, j in sorted(found):
            for di, dj in _CORNERS:
                s, t = i + di, j + dj
                if 0 <= s < n_src and 0 <= t < n_tgt and s not in src_linked and t not in tgt_linked:
                    found.add((s, t))
                    src_linked.add(s)
                    tgt_linked.add(t)
                    grew = True
    return sorted(found)

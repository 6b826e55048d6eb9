"""A trained model's attention on sentence pairs, under teacher forcing: as arrays, as heatmaps, as
alignments.

Letters: B batch, H heads, T target length (pieces + EOS), S source length (pieces + EOS).

``model(batch, need_attention=True)`` gives every layer and head at once (``models/protocol.py``);
``teacher_forced_attention`` runs it on batches of sentence pairs and cuts each sentence's weights out of
the padded batch as numpy arrays, which ``plot.py`` draws and ``alignment.py`` turns into word links (both
know no model). ``draw_attention`` (``attnmt plot`` and the heatmaps drawn during training) and
``align_corpus`` (``attnmt align``) are the two uses, from text to files or links.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data.arrival import chunks
from ..data.batching import collate, token_batches
from ..data.readers import clean
from ..data.words import Pieces, has_cjk, membership_of, merge, segment, word_count, words_to_pieces
from ..decoding.translator import Translator
from ..errors import DataError
from .alignment import (
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
from .attribution import Attribution, attribute_pairs, from_attention
from .explorer import ExplorerSentence, write_explorer

if TYPE_CHECKING:
    from .plot import HeatmapFigure

AttentionMaps = dict[str, list[np.ndarray]]
"""kind (``cross``, ``enc_self``, ``dec_self``) -> one array per layer: cross (H, T, S), enc_self
(H, S, S), dec_self (H, T, T); rows are queries and sum to 1."""

# kind -> (rows, columns)
_SIDES = {"cross": ("tgt", "src"), "enc_self": ("src", "src"), "dec_self": ("tgt", "tgt")}


@torch.no_grad()
def teacher_forced_attention(
    model,
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
    max_tokens: int = 4000,
    kinds: Sequence[str] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[AttentionMaps]:
    """The attention of ``model`` reading each source (EOS appended) while forced to produce its target
    (BOS + target in, target + EOS out), one ``AttentionMaps`` per pair, in order. Pairs are batched by
    length under ``max_tokens`` padded pieces; ``kinds`` keeps only those kinds (default: all);
    ``on_batch(n)`` is told each batch's pairs as they are done (a progress bar)."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    was_training = model.training
    model.eval()
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids)]
    results: list[AttentionMaps] = [{} for _ in src_ids]
    try:
        for chunk in token_batches(lengths, order, max_tokens):
            batch = collate([src_ids[i] for i in chunk], [tgt_ids[i] for i in chunk]).to(device)
            attention = model(batch, need_attention=True).attention  # kind -> [(B, H, rows, cols)] per layer
            sizes = {"src": batch.src_lengths.tolist(), "tgt": batch.tgt_lengths.tolist()}
            for kind, per_layer in attention.items():
                if kinds is not None and kind not in kinds:
                    continue
                rows_side, cols_side = _SIDES[kind]
                stacked = torch.stack(per_layer, dim=1).float().cpu().numpy()  # (B, L, H, rows, cols)
                for b, i in enumerate(chunk):
                    rows, cols = sizes[rows_side][b], sizes[cols_side][b]
                    results[i][kind] = list(stacked[b, :, :, :rows, :cols])
            if on_batch is not None:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return results


# ------------------------------------------------------------------------------------------ heatmaps


@dataclass
class Drawn:
    figures: int = 0  # files written
    sentences: int = 0  # input lines read, empty ones included
    truncated: int = 0  # sources cut to decode.max_src_len


@dataclass(frozen=True)
class HeatmapOptions:
    """What to draw of each sentence: the attention kinds, per kind the layers (0-based; None = all), one
    head (0-based; None = every head and their average), word labels instead of pieces, the file format."""

    kinds: tuple[str, ...] = ("cross",)
    layers: dict[str, int | None] | None = None
    head: int | None = None
    words: bool = False
    fmt: str = "png"
    dpi: int = 100
    title: str = ""


def draw_encoded(translator: Translator, src_ids: Sequence[Sequence[int]], numbers: Sequence[int],
                 out_dir: Path, options: HeatmapOptions, painter: HeatmapFigure | None = None) -> int:
    """Translate encoded sources, read each translation back under teacher forcing, and write the heatmaps
    of sentence ``numbers[i]`` into ``out_dir`` (``plot.sentence_maps``); returns the files written."""
    from .plot import HeatmapFigure, sentence_maps  # matplotlib loads only for what draws

    painter = painter or HeatmapFigure()
    tokenizer, kinds = translator.tokenizer, list(options.kinds)
    hyps = [found[0].tokens for found in translator.search(src_ids)]
    maps = teacher_forced_attention(translator.model, src_ids, hyps, translator.device,
                                    translator.decode.max_tokens, kinds)
    written = 0
    for src, hyp, pair_maps, number in zip(src_ids, hyps, maps, numbers):
        src_pieces, tgt_pieces = tokenizer.src_pieces(src) + ["</s>"], tokenizer.tgt_pieces(hyp)
        labels = {"cross": (src_pieces, tgt_pieces + ["</s>"]), "enc_self": (src_pieces, src_pieces),
                  "dec_self": (["<s>"] + tgt_pieces, ["<s>"] + tgt_pieces)}
        for kind in kinds:
            layer = (options.layers or {}).get(kind)
            written += len(sentence_maps(out_dir, number, {kind: pair_maps[kind]}, labels,
                                         None if layer is None else [layer], options.head, options.words,
                                         options.fmt, options.dpi, options.title, painter))
    return written


def draw_attention(translator: Translator, lines: Iterable[str], out_dir: Path, options: HeatmapOptions,
                   chunk_lines: int = 1000) -> Drawn:
    """``attnmt plot``: the heatmaps of every line (numbered from 1 in input order; an empty line keeps its
    number and gets no figure), ``chunk_lines`` lines at a time."""
    from .plot import HeatmapFigure

    drawn, painter = Drawn(), HeatmapFigure()
    for chunk in chunks(lines, chunk_lines):
        sources = translator.encode(chunk)
        numbers = [drawn.sentences + i + 1 for i in sources.lines]
        drawn.figures += draw_encoded(translator, sources.ids, numbers, out_dir, options, painter)
        drawn.truncated += len(sources.truncated)
        drawn.sentences += len(chunk)
    return drawn


# ---------------------------------------------------------------------------------------- alignments


def default_align_options(cfg, checkpoint: Path | None = None) -> AlignOptions:
    """How ``align`` reads a model by default: the layer and heads ``align --calibrate`` chose for its run
    (``read_calibration``), else for a model trained with ``train.alignment`` the layer and heads it
    taught, else every layer and head averaged; the mutual argmax."""
    calibrated = read_calibration(checkpoint) if checkpoint is not None else None
    if calibrated is not None:
        return AlignOptions(*calibrated)
    guided = cfg.train.alignment
    if guided is None:
        return AlignOptions()
    return AlignOptions(guided.layer - 1, tuple(h - 1 for h in guided.heads))


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


def _word_pieces(translator: Translator, sources: Sequence[str], targets: Sequence[str], gold: Gold | None):
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


def _links(cross: list[np.ndarray], src_groups, tgt_groups, options: AlignOptions) -> list[Link]:
    matrix = attention_rows(cross, options.layer, options.heads, options.shift)  # (T, S)
    if options.words == "any":  # links between pieces; words linked if any of their pieces are
        pieces = extract_alignment(matrix, options.method, options.threshold)
        return words_from_piece_links(pieces, membership_of(src_groups, matrix.shape[1]),
                                      membership_of(tgt_groups, matrix.shape[0]))
    words = merge(matrix, tgt_groups, src_groups)  # (target words, source words)
    return extract_alignment(words, options.method, options.threshold)


def _cross(translator: Translator, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
           source: str = "attention", steps: int = 64,
           on_batch: Callable[[int], None] | None = None) -> list[list[np.ndarray]]:
    """Per pair, what links are read from: the cross-attention (one (H, T, S) array per layer) or, for a
    gradient method (``attribution.GRADIENT_METHODS``), its source shares as one layer of one head."""
    if source == "attention":
        maps = teacher_forced_attention(translator.model, src_ids, tgt_ids, translator.device,
                                        translator.decode.max_tokens, ["cross"], on_batch)
        return [pair_maps["cross"] for pair_maps in maps]
    found = attribute_pairs(translator.model, src_ids, tgt_ids, source, translator.device, steps,
                            translator.decode.max_tokens, on_batch)
    return [[a.source[None]] for a in found]


def _directional_links(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                       options: AlignOptions, gold: Gold | None,
                       on_batch: Callable[[int], None] | None = None) -> list[list[Link]]:
    src_ids, src_groups, tgt_ids, tgt_groups = _word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    cross = _cross(translator, [src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs], options.source,
                   options.steps, on_batch)
    links: list[list[Link]] = [[] for _ in sources]
    for i, pair_cross in zip(pairs, cross):
        links[i] = _links(pair_cross, src_groups[i], tgt_groups[i], options)
    return links


# ---------------------------------------------------------------------------------------- attribution


@dataclass
class Attributed:
    method: str
    targets: list[str]  # the targets attributed (given, or the model's translations)
    src: list[list[str]]  # per pair: the source pieces and </s> (the columns)
    tgt: list[list[str]]  # per pair: the target pieces and </s> (the rows)
    found: list[Attribution | None]  # per pair; None for an empty line


def attribute_corpus(translator: Translator, sources: Sequence[str], targets: Sequence[str] | None = None,
                     method: str = "integrated_gradients", steps: int = 64,
                     on_pair: Callable[[int], None] | None = None, workers: int | None = None) -> Attributed:
    """``attnmt attribute``: each pair's attribution by ``method`` (``attribution.METHODS``; the model's
    own translation unless ``targets`` are given), on the pieces ``align`` reads the lines as."""
    if targets is None:
        targets = translator.best(sources)
    src_ids, _, tgt_ids, _ = _word_pieces(translator, sources, targets, None)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    chosen = ([src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs])
    if method == "attention":
        maps = teacher_forced_attention(translator.model, *chosen, translator.device,
                                        translator.decode.max_tokens, ["cross"], on_pair)
        results = [from_attention(pair_maps["cross"]) for pair_maps in maps]
    else:
        results = attribute_pairs(translator.model, *chosen, method, translator.device, steps,
                                  translator.decode.max_tokens, on_pair, workers)
    found: list[Attribution | None] = [None] * len(sources)
    for i, result in zip(pairs, results):
        found[i] = result
    tokenizer = translator.tokenizer
    return Attributed(method, list(targets), [tokenizer.src_pieces(ids) + ["</s>"] for ids in src_ids],
                      [tokenizer.tgt_pieces(ids) + ["</s>"] for ids in tgt_ids], found)


# ------------------------------------------------------------------------------------------ explorer


def _page_words(line: str, spec, n_pieces: int) -> tuple[np.ndarray, list[str]]:
    """The words ``words_to_pieces`` read ``line`` as, for the page: a membership matrix over its pieces
    and EOS (EOS a word of its own), and the word labels."""
    labels = [w.text for w in segment(line)] if has_cjk(line) else clean(line).split()
    words = word_count(spec)
    matrix = np.zeros((n_pieces + 1, words + 1))
    matrix[:n_pieces, :words] = membership_of(spec, n_pieces)
    matrix[n_pieces, words] = 1.0
    if len(labels) != words:  # cannot happen for lines words_to_pieces read; labels then by number
        labels = [str(w + 1) for w in range(words)]
    return matrix, labels + ["</s>"]


@dataclass
class Explored:
    sentences: int  # pairs on the page
    bytes: int  # the page's size
    targets: list[str]  # the targets read (given, or the model's translations)


def explore(translator: Translator, sources: Sequence[str], out: Path,
            targets: Sequence[str] | None = None, kinds: Sequence[str] = ("cross",),
            options: AlignOptions = AlignOptions(), gold: Gold | None = None,
            title: str = "attnmt attention", attribution: Attributed | None = None) -> Explored:
    """``attnmt plot --html``: every layer and head of ``kinds`` for each pair (the model's own translation
    unless ``targets`` are given), with the word alignment ``align`` would extract (``options``) and, with
    ``gold``, each sentence's AER, written as one self-contained HTML page (``explorer.write_explorer``).
    With ``attribution`` (``attribute_corpus`` of the same pairs), the page shows its source and prefix
    shares too (kinds ``attribution`` and ``attribution_prefix``: one layer of one head).
    Sentences are numbered from 1 in input order; an empty line is left out."""
    if targets is None:
        targets = translator.best(sources)
    page = explorer_sentences(translator, sources, targets, kinds, options, gold, attribution)
    if not page:
        raise DataError("no sentence pairs to draw (every line is empty)")
    return Explored(len(page), write_explorer(out, page, title), list(targets))


def explorer_sentences(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                       kinds: Sequence[str] = ("cross",), options: AlignOptions = AlignOptions(),
                       gold: Gold | None = None,
                       attribution: Attributed | None = None) -> list[ExplorerSentence]:
    """What ``explore`` draws, one ``ExplorerSentence`` per pair that has pieces on both sides (numbered from
    1 in input order), for a page or for ``attnmt serve``'s ``/attention``."""
    tokenizer = translator.tokenizer
    src_ids, src_groups, tgt_ids, tgt_groups = _word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    maps = teacher_forced_attention(translator.model, [src_ids[i] for i in pairs],
                                    [tgt_ids[i] for i in pairs], translator.device,
                                    translator.decode.max_tokens, list(kinds))
    if attribution is not None:
        kinds = [*kinds, "attribution", "attribution_prefix"]
        for i, pair_maps in zip(pairs, maps):
            found = attribution.found[i]
            pair_maps.update(attribution=[found.source[None]], attribution_prefix=[found.prefix[None]])
    page = []
    for i, pair_maps in zip(pairs, maps):
        src, tgt = tokenizer.src_pieces(src_ids[i]), tokenizer.tgt_pieces(tgt_ids[i])
        links = _links(pair_maps["cross"], src_groups[i], tgt_groups[i], options)
        sure, possible, aer = None, None, None
        if gold is not None:
            sure, possible = gold.sure[i], gold.possible[i]
            aer = alignment_scores([links], [sure], [possible]).aer
        # The page shows the words align read (pre-segmented CJK: the given words), and EOS as one more.
        page.append(ExplorerSentence(i + 1, src + ["</s>"], tgt + ["</s>"], ["<s>"] + tgt,
                                     {kind: pair_maps[kind] for kind in kinds}, links, sure, possible, aer,
                                     _page_words(sources[i], src_groups[i], len(src)),
                                     _page_words(targets[i], tgt_groups[i], len(tgt))))
    return page


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
    src_ids, src_groups, tgt_ids, tgt_groups = _word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    cross = _cross(translator, [src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs])
    if not cross:
        raise DataError("no sentence pairs to calibrate on (every line is empty)")
    n_layers, n_heads = len(cross[0]), cross[0][0].shape[0]

    def aer(layer: int | None, heads: tuple[int, ...] | None) -> float:
        reading = dataclasses.replace(options, layer=layer, heads=heads)
        links: list[list[Link]] = [[] for _ in sources]
        for i, pair_cross in zip(pairs, cross):
            links[i] = _links(pair_cross, src_groups[i], tgt_groups[i], reading)
        return alignment_scores(links, gold.sure, gold.possible).aer

    head_aer = {(layer, h): aer(layer, (h,)) for layer in range(n_layers) for h in range(n_heads)}
    tried = [(layer, heads, aer(layer, heads)) for layer, heads in _readings(n_layers, n_heads, head_aer)]
    tried += [(layer, (h,), value) for (layer, h), value in head_aer.items()]
    ranked = sorted(enumerate(tried), key=lambda item: (item[1][2], item[0]))
    best = ranked[0][1]
    return Calibration(best[0], best[1], best[2], [entry for _, entry in ranked])


"""What a model owes each input, on a page: gradient attribution and ALTI+ of sentence pairs
(``attnmt attribute``), and the explorer page of their attention (``attnmt plot --html``, ``attnmt serve``'s
``/attention``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.readers import clean
from ..data.words import has_cjk, membership_of, segment, word_count
from ..decoding.translator import Translator
from ..errors import DataError
from .alti import alti_pairs
from .attention_maps import teacher_forced_attention
from .attribution import Attribution, attribute_pairs, from_attention
from .explorer import ExplorerSentence, write_explorer
from .links import AlignOptions, Gold, alignment_scores
from .reading import read_links, word_pieces
from .rollout import flow, rollout


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
    src_ids, _, tgt_ids, _ = word_pieces(translator, sources, targets, None)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    chosen = ([src_ids[i] for i in pairs], [tgt_ids[i] for i in pairs])
    if method == "attention":  # the alignment layer's, for a model that has one
        kind = "cross" if getattr(translator.model, "aligner", None) is None else "align"
        maps = teacher_forced_attention(translator.model, *chosen, translator.device,
                                        translator.decode.max_tokens, [kind], on_pair)
        results = [from_attention(pair_maps[kind]) for pair_maps in maps]
    elif method == "alti":
        results = alti_pairs(translator.model, *chosen, translator.device, on_pair)
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
    shares too (kinds ``attribution`` and ``attribution_prefix``, or ``alti`` and ``alti_prefix``: one layer
    of one head), with each prediction's source share as a line.
    Sentences are numbered from 1 in input order; an empty line is left out."""
    if targets is None:
        targets = translator.best(sources)
    page = explorer_sentences(translator, sources, targets, kinds, options, gold, attribution)
    if not page:
        raise DataError("no sentence pairs to draw (every line is empty)")
    return Explored(len(page), write_explorer(out, page, title), list(targets))


# Kinds computed from every attention of a pair (``rollout.py``).
RELEVANCE = {"rollout": rollout, "flow": flow}


def explorer_sentences(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                       kinds: Sequence[str] = ("cross",), options: AlignOptions = AlignOptions(),
                       gold: Gold | None = None,
                       attribution: Attributed | None = None) -> list[ExplorerSentence]:
    """What ``explore`` draws, one ``ExplorerSentence`` per pair that has pieces on both sides (numbered from
    1 in input order), for a page or for ``attnmt serve``'s ``/attention``. ``kinds``: attention kinds, and
    ``rollout`` or ``flow`` (a Transformer's; each adds its source and prefix kinds and its share line)."""
    tokenizer = translator.tokenizer
    src_ids, src_groups, tgt_ids, tgt_groups = word_pieces(translator, sources, targets, gold)
    pairs = [i for i in range(len(sources)) if src_ids[i] and tgt_ids[i]]
    relevance = [k for k in kinds if k in RELEVANCE]
    attention = [k for k in kinds if k not in RELEVANCE]
    read = ["cross", "enc_self", "dec_self"] if relevance else attention
    read = [*read, options.kind] if options.kind not in read else read  # what the links are read from
    maps = teacher_forced_attention(translator.model, [src_ids[i] for i in pairs],
                                    [tgt_ids[i] for i in pairs], translator.device,
                                    translator.decode.max_tokens, read)
    shares: list[dict] = [{} for _ in maps]
    for name in relevance:
        for pair_maps, pair_shares in zip(maps, shares):
            source, prefix = RELEVANCE[name](pair_maps["enc_self"], pair_maps["dec_self"], pair_maps["cross"])
            pair_maps.update({name: [source[None]], name + "_prefix": [prefix[None]]})
            pair_shares[name] = source.sum(1)
    if attribution is not None:
        name = "alti" if attribution.method == "alti" else "attribution"
        relevance.append(name)
        for i, pair_maps, pair_shares in zip(pairs, maps, shares):
            found = attribution.found[i]
            pair_maps.update({name: [found.source[None]], name + "_prefix": [found.prefix[None]]})
            pair_shares[name] = found.source.sum(1)
    kinds = [*attention, *(k + end for k in relevance for end in ("", "_prefix"))]
    page = []
    for i, pair_maps, pair_shares in zip(pairs, maps, shares):
        src, tgt = tokenizer.src_pieces(src_ids[i]), tokenizer.tgt_pieces(tgt_ids[i])
        links = read_links(pair_maps[options.kind], src_groups[i], tgt_groups[i], options)
        sure, possible, aer = None, None, None
        if gold is not None:
            sure, possible = gold.sure[i], gold.possible[i]
            aer = alignment_scores([links], [sure], [possible]).aer
        # The page shows the words align read (pre-segmented CJK: the given words), and EOS as one more.
        page.append(ExplorerSentence(i + 1, src + ["</s>"], tgt + ["</s>"], ["<s>"] + tgt,
                                     {kind: pair_maps[kind] for kind in kinds}, links, sure, possible, aer,
                                     _page_words(sources[i], src_groups[i], len(src)),
                                     _page_words(targets[i], tgt_groups[i], len(tgt)), pair_shares))
    return page

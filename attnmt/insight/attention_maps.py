"""A trained model's attention on sentence pairs, under teacher forcing: as arrays and as heatmaps.

Letters: B batch, H heads, T target length (pieces + EOS), S source length (pieces + EOS).

``model(batch, need_attention=True)`` gives every layer and head at once (``models/protocol.py``);
``teacher_forced_attention`` runs it on batches of sentence pairs and cuts each sentence's weights out of
the padded batch as numpy arrays, which ``plot.py`` draws, ``reading.py`` turns into word links and
``exploring.py`` puts on a page (``plot`` and ``links`` know no model). ``draw_attention`` (``attnmt
plot`` and the heatmaps drawn during training) is the use here, from text to files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data.arrival import chunks
from ..data.batching import collate, token_batches
from ..decoding.translator import Translator

if TYPE_CHECKING:
    from .plot import HeatmapFigure

AttentionMaps = dict[str, list[np.ndarray]]
"""kind (``cross``, ``enc_self``, ``dec_self``; ``align`` for a model with an alignment layer) -> one array
per layer: cross (H, T, S), enc_self (H, S, S), dec_self (H, T, T), align (1, T, S); rows are queries and
sum to 1."""

# kind -> (rows, columns)
_SIDES = {"cross": ("tgt", "src"), "enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"),
          "align": ("tgt", "src")}


@torch.no_grad()
def teacher_forced_attention(
    model,
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
    max_tokens: int = 4000,
    kinds: Sequence[str] | None = None,
    on_batch: Callable[[int], None] | None = None,
    full_context: bool = False,
) -> list[AttentionMaps]:
    """The attention of ``model`` reading each source (EOS appended) while forced to produce its target
    (BOS + target in, target + EOS out), one ``AttentionMaps`` per pair, in order. Pairs are batched by
    length under ``max_tokens`` padded pieces; ``kinds`` keeps only those kinds (default: all);
    ``on_batch(n)`` is told each batch's pairs as they are done (a progress bar). ``full_context``:
    the decoder's attention from the pass in which every position sees the whole target
    (``models/protocol.py``)."""
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
            # kind -> [(B, H, rows, cols)] per layer
            attention = model(batch, need_attention=True, full_context=full_context).attention
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
        labels = {"cross": (src_pieces, tgt_pieces + ["</s>"]), "align": (src_pieces, tgt_pieces + ["</s>"]),
                  "enc_self": (src_pieces, src_pieces),
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

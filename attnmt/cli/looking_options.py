"""The options of ``plot`` and ``align``, one ``Annotated`` alias each, so that each command's signature
is a line per option (its help stays beside its type here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import (
    AlignMethod,
    AttributionMethod,
    Heads,
    Layer,
    Symmetrization,
    WordRule,
    parse_heads,
    parse_layer,
)

# ------------------------------------------------------------------------------------------------ plot

Sentences = Annotated[list[str] | None, typer.Argument(help="Sentences to translate and draw (else --input).",
                                                        show_default=False)]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="Draw only the first N sentences.")]
FiguresOut = Annotated[Path | None, typer.Option("--out", "-o", help="Folder to write the figures into.",
                                                 show_default=False)]
Html = Annotated[Path | None, typer.Option("--html", help="Write one self-contained HTML explorer of every "
                                           "sentence, layer and head here instead (opens offline in any "
                                           "browser).", show_default=False)]
PlotTgt = Annotated[Path | None, typer.Option("--tgt", help="With --html: target sentences to read (default: "
                                              "the model's own translations).")]
PlotGold = Annotated[Path | None, typer.Option("--gold", help="With --html and --tgt: gold alignments "
                                               "(Pharaoh) to colour the drawn alignment by, with each "
                                               "sentence's AER.")]
PlotOneBased = Annotated[bool, typer.Option("--one-based", help="Word indices in --gold count from 1.")]
PlotLayer = Annotated[int | None, typer.Option("--layer", min=1, help="Only this layer (1-based; default: "
                                               "every layer).")]
PlotHead = Annotated[int | None, typer.Option("--head", min=1, help="Only this head (1-based; default: every "
                                              "head and their average).")]
SelfAttention = Annotated[bool, typer.Option("--self", help="Also draw encoder and decoder self-attention "
                                             "(Transformer).")]
PlotWords = Annotated[bool, typer.Option("--words", help="Label words instead of pieces (source pieces "
                                         "summed, target pieces averaged).")]

# ----------------------------------------------------------------------------------------------- align

Src = Annotated[Path, typer.Option("--src", help="Source sentences, one per line (words split on spaces).",
                                   show_default=False)]
AlignTgt = Annotated[Path | None, typer.Option("--tgt", help="Target sentences to align with (default: the "
                                               "model's own translations).")]
AlignGold = Annotated[Path | None, typer.Option("--gold", help="Gold alignments (Pharaoh: i-j sure, i?j or "
                                                "ipj possible) to score against.")]
AlignLayer = Annotated[Layer | None, typer.Option("--layer", parser=parse_layer, metavar="LAYER",
                                                  help="Cross-attention layer to align with: 1, 2, ..., "
                                                  "last, or avg (every layer; the default, unless the model "
                                                  "was trained with train.alignment: then its layer).",
                                                  show_default=False)]
AlignHeads = Annotated[Heads | None, typer.Option("--heads", parser=parse_heads, metavar="HEADS",
                                                  help="Heads to average: 1,3 (1-based) or all (the default, "
                                                  "unless the model was trained with train.alignment: then "
                                                  "its heads).", show_default=False)]
Shift = Annotated[bool, typer.Option("--shift", help="Shift-Att: read each target word's row where it is the "
                                     "decoder's input, one step after the one predicting it.")]
Method = Annotated[AlignMethod, typer.Option("--method", help="mutual: the argmax in both directions; "
                                             "argmax: each target word's most attended source word; "
                                             "threshold: every weight >= --threshold.")]
Reverse = Annotated[Path | None, typer.Option("--reverse", help="A model trained in the other direction "
                                              "(target to source): align both ways and symmetrize.",
                                              show_default=False)]
Symmetrize = Annotated[Symmetrization | None, typer.Option(
    "--symmetrize", help="With --reverse: how the two directions combine (Moses's heuristics; default "
    "grow-diag-final-and).", show_default=False)]
Words = Annotated[WordRule, typer.Option("--words", help="merged: attention merged into words, then linked; "
                                         "any: pieces linked, two words linked if any of their pieces are.")]
Threshold = Annotated[float, typer.Option("--threshold", help="Weight a link needs with --method threshold "
                                          "(0 < X <= 1).")]
AlignOneBased = Annotated[bool, typer.Option("--one-based", help="Word indices in --gold and in the output "
                                             "count from 1.")]
AlignOutput = Annotated[Path | None, typer.Option("--output", "-o", help="Write the alignments here "
                                                  "(atomically).")]
HypOut = Annotated[Path | None, typer.Option("--hyp-out", help="Without --tgt: also write the translations "
                                             "that were aligned.")]
ScoresJson = Annotated[bool, typer.Option("--json", help="With --gold: print the scores as JSON.")]
Calibrate = Annotated[Path | None, typer.Option("--calibrate", help="Gold alignments of --src and --tgt "
                                                "(a small dev set): score every layer and head reading, keep "
                                                "the best in the run folder as the default.",
                                                show_default=False)]
From = Annotated[AttributionMethod, typer.Option("--from", help="What links are read from: the "
                                                 "cross-attention, or a gradient attribution's source shares "
                                                 "(see attribute).")]

"""The option types the commands share, and the choices Typer checks for them (Enums).

An option shares its spelling with the YAML key it overrides: ``--beam-size`` is ``decode.beam_size``,
``--max-tokens`` is ``decode.max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..config.choices import METRICS, Device, Scores
from ..insight.link_request import Heads, Layer

__all__ = ["AlignMethod", "AttributionMethod", "Device", "ExportFormat", "FigureFormat", "Heads", "Layer",
           "Metrics", "Quantization", "StepsOpt", "Symmetrization", "WordRule"]


class AlignMethod(str, Enum):
    """How ``align`` links words (``alignment.extract_alignment``): the argmax in both directions, each
    target word's most attended source word, or every weight >= X."""

    mutual = "mutual"
    argmax = "argmax"
    threshold = "threshold"


class AttributionMethod(str, Enum):
    """``attribute --method`` and ``align --from``: a gradient attribution (``attribution.py``, captum) or
    the cross-attention itself, or ALTI+ (``alti.py``: contributions through the whole network)."""

    saliency = "saliency"
    input_x_gradient = "input_x_gradient"
    integrated_gradients = "integrated_gradients"
    attention = "attention"
    alti = "alti"


StepsOpt = Annotated[int, typer.Option("--steps", min=2, max=4096, help="Integrated gradients: points on "
                                       "the path from the baseline (Gauss-Legendre).")]


class WordRule(str, Enum):
    """``align --words``: attention merged into words before linking, or links between pieces, two words
    linked if any of their pieces are."""

    merged = "merged"
    any = "any"


class Symmetrization(str, Enum):
    """``align --symmetrize``: how the two directions combine (``alignment.symmetrize``, Moses's names)."""

    intersection = "intersection"
    union = "union"
    grow_diag = "grow-diag"
    grow_diag_final = "grow-diag-final"
    grow_diag_final_and = "grow-diag-final-and"


class ToyLanguage(str, Enum):
    """``toy-data --lang``: the toy task's target language."""

    de = "de"
    zh = "zh"


class ExportFormat(str, Enum):
    """``export --to``: the inference engine to export for."""

    ctranslate2 = "ctranslate2"
    huggingface = "huggingface"


class Quantization(str, Enum):
    """``export --quantization``: how CTranslate2 stores the weights (``ctranslate.QUANTIZATIONS``)."""

    float32 = "float32"
    int8_float32 = "int8_float32"
    int8 = "int8"


class FigureFormat(str, Enum):
    png = "png"
    svg = "svg"
    pdf = "pdf"


@dataclass(frozen=True)
class Metrics:
    """``eval --metrics bleu,chrf``: metric names, checked against ``metrics.METRICS``."""

    names: tuple[str, ...]

    @classmethod
    def parse(cls, value: str | Metrics) -> Metrics:
        if isinstance(value, Metrics):
            return value
        names = tuple(m.strip().lower() for m in value.split(",") if m.strip())
        unknown = [m for m in names if m not in METRICS]
        if unknown or not names:
            raise typer.BadParameter(f"{', '.join(unknown) or '(none)'} not among {', '.join(METRICS)}")
        return cls(names)


def parse_layer(value: str | Layer) -> Layer:
    """``--layer``'s parser: ``link_request.Layer.parse``, a bad value Typer's usage error."""
    try:
        return Layer.parse(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def parse_heads(value: str | Heads) -> Heads:
    """``--heads``'s parser: ``link_request.Heads.parse``, a bad value Typer's usage error."""
    try:
        return Heads.parse(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


ConfigArg = Annotated[Path, typer.Argument(help="The YAML config file.", show_default=False)]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="The run folder "
                                                "(default: train.run_dir of the config).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config key, "
                                                  "e.g. --set train.lr=3e-4 (repeatable).")]

ModelArg = Annotated[Path, typer.Argument(help="A checkpoint file, or a run folder "
                                          "(its best checkpoint, else its latest).", show_default=False)]
SentencesArg = Annotated[list[str] | None, typer.Argument(help="Sentences (else --input).",
                                                          show_default=False)]
InputOpt = Annotated[Path | None, typer.Option("--input", "-i",
                                               help="A file of sentences, or - for stdin (read lazily).")]
BeamOpt = Annotated[int | None, typer.Option("--beam-size", min=1, help="Beam size; 1 = greedy "
                                             "(default: the model's decode.beam_size).")]
NbestOpt = Annotated[int, typer.Option("--nbest", min=1,
                                       help="Write this many hypotheses per line (TSV: index, score, text).")]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", min=1,
                                                  help="Batch budget: padded source pieces x beam.")]
TgtLangOpt = Annotated[str | None, typer.Option("--tgt-lang", help="A multilingual model's target language "
                                               "(default: its data.tgt_lang).", show_default=False)]
Int8Opt = Annotated[bool, typer.Option("--int8", help="int8 linear layers and output projection (torch's "
                                       "quantized CPU engine): faster on the CPU, a little less exact; "
                                       "decode.quantize: int8 in the config does the same.")]
DeviceOpt = Annotated[Device, typer.Option("--device",
                                           help="Where to compute; auto takes CUDA when there is one.")]
LengthPenaltyOpt = Annotated[float | None, typer.Option("--length-penalty", min=0.0, max=10.0,
                                                        help="GNMT alpha, 0 to 10 "
                                                        "(default: decode.length_penalty).")]
FormatOpt = Annotated[FigureFormat, typer.Option("--format", help="Figure format.")]
DpiOpt = Annotated[int, typer.Option("--dpi", min=10, max=1200,
                                     help="Resolution of png figures (dots per inch).")]


# The options of ``plot`` and ``align``, one alias each, so that each command's signature is a line per
# option.

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
Rollout = Annotated[bool, typer.Option("--rollout", help="With --html: also attention rollout (Abnar and "
                                       "Zuidema 2020): each prediction's shares of the source and of the "
                                       "prefix, attention followed through every layer (Transformer).")]
Flow = Annotated[bool, typer.Option("--flow", help="With --html: also attention flow (Abnar and Zuidema "
                                    "2020): the maximum flow from each prediction to each input through the "
                                    "layers (Transformer; a max-flow problem per pair of pieces, so the time "
                                    "grows as the fourth power of a sentence's length: about 1 s for a "
                                    "sentence of 40 pieces and 10 s for one of 85 on a 2 + 2-layer model, "
                                    "28 s on 6 + 6; a page past --flow-budget is refused before "
                                    "translating).")]
FlowBudget = Annotated[float | None, typer.Option("--flow-budget", min=0.0, metavar="SECONDS",
                                           help="With --flow: the seconds attention flow may take on the "
                                           "whole page, as estimated from the sentences' pieces and the "
                                           "model's layers before any translating (and again once the "
                                           "translations' lengths are known). Past it plot stops and says "
                                           "the estimate: raise this to draw it anyway. Default: 30.")]
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
                                              "(target to source): align both ways and symmetrize "
                                              "(default: the one the run folder names in reverse.json).",
                                              show_default=False)]
FullContext = Annotated[bool | None, typer.Option(
    "--full-context/--causal", help="Read the cross-attention of the pass in which every target piece sees "
    "the whole target (Garg et al. 2019), or of the causal pass (default: the pass the model was taught "
    "in, train.alignment.full_context).", show_default=False)]
OneWay = Annotated[bool, typer.Option("--one-way", help="Align in this direction only, even when the run "
                                      "folder names its reverse model (reverse.json, written by "
                                      "scripts/bootstrap_guided.py).")]
Symmetrize = Annotated[Symmetrization | None, typer.Option(
    "--symmetrize", help="With a reverse model: how the two directions combine (Moses's heuristics; default "
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
                                                 "cross-attention, or the source shares of a gradient "
                                                 "attribution or of ALTI+ (see attribute).")]

# translate's controls of each input line's output
ScoresOpt = Annotated[Scores | None, typer.Option("--scores", help="words: one JSON object per input line, "
                                                  "each output with its score and every word's "
                                                  "probability (and the end's).", show_default=False)]
PrefixOpt = Annotated[Path | None, typer.Option("--prefix", help="Target prefixes, one per input line (an "
                                                "empty line: none): each translation starts with its "
                                                "line's prefix and goes on from there.", show_default=False)]
ConstraintsOpt = Annotated[Path | None, typer.Option("--constraints", help="Phrases each translation must "
                                                     "hold, one input line's per line, tab-separated (an "
                                                     "empty line: none); beam search makes room for them.",
                                                     show_default=False)]
ShortlistOpt = Annotated[Path | None, typer.Option(
    "--shortlist", show_default=False,
    help="A lexical shortlist (attnmt shortlist RUN writes RUN/shortlist.pt): each batch's output layer cut "
         "to the pieces its sources may translate to; faster, scores normalised over those pieces. Not with "
         "prefixes, constraints or sampling (they search every piece).")]

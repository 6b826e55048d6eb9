"""Commands that look inside a model: ``plot`` (heatmaps), ``align`` (word alignments), ``plot-curves``."""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError, DataError
from ..insight.link_request import AlignRequest, check_request
from ..insight.link_request import reading as model_reading
from . import options as opt
from .app import command
from .common import (
    FileProgress,
    open_for_attention,
    read_pairs,
    sentences_or_input,
    write_output,
)
from .contract import Output
from .options import (
    BeamOpt,
    DeviceOpt,
    DpiOpt,
    FormatOpt,
    Heads,
    InputOpt,
    Int8Opt,
    Layer,
    ModelArg,
    StepsOpt,
    Symmetrization,
)


def _check_number(option: str, value: int | None, count: int, what: str) -> int | None:
    """A 1-based --layer/--head value checked against the model; returned 0-based."""
    if value is None:
        return None
    if not 1 <= value <= count:
        raise ConfigError(f"{option} {value}: the model has {count} {what} (1..{count})")
    return value - 1


@command(inputs=("model", "input_", "tgt", "gold"), outputs={"out": Output(folder=True), "html": Output()})
def plot(model: ModelArg, sentences: opt.Sentences = None, input_: InputOpt = None,
         limit: opt.Limit = None, out: opt.FiguresOut = None, html: opt.Html = None, tgt: opt.PlotTgt = None,
         gold: opt.PlotGold = None, one_based: opt.PlotOneBased = False, layer: opt.PlotLayer = None,
         head: opt.PlotHead = None, self_: opt.SelfAttention = False, rollout: opt.Rollout = False,
         flow: opt.Flow = False, flow_budget: opt.FlowBudget = None, words: opt.PlotWords = False,
         fmt: FormatOpt = "png", dpi: DpiOpt = 100, beam_size: BeamOpt = None, int8: Int8Opt = False,
         device: DeviceOpt = "auto") -> None:
    """Translate sentences, then draw the model's attention on each sentence and its translation.

    The translation is read back under teacher forcing, so every layer and head is there: an LSTM's one
    attention map; a Transformer's cross-attention per layer as a grid of heads and their average (and with
    --self its encoder and decoder self-attention).
    Files: NNNN_cross_layerL.png, NNNN_enc_self_layerL.png, ...; a model with an alignment layer
    (train.alignment.module: layer) also NNNN_align_layer1.png, unless --layer or --head chooses.

    With --html FILE, one page instead: a sentence navigator; cross, encoder and decoder self-attention
    (with --self); any layer, head or their average; a heatmap or a line view; pieces or words; the word
    alignment that align extracts drawn on top (with --tgt and --gold, coloured by gold, with each AER);
    with --rollout and --flow, attention rollout and flow, with each prediction's source share as a line.
    A page whose flow would take longer than --flow-budget seconds (estimated) is refused before translating.
    """
    from ..insight.attention_maps import HeatmapOptions, draw_attention
    from ..insight.link_request import has_aligner
    from ..insight.plot import KIND_TITLES
    from ..models import attention_layout

    _check_plot_options(out, html, tgt, gold, layer, head, words)
    relevance = [name for name, given in (("rollout", rollout), ("flow", flow)) if given]
    if relevance and html is None:
        raise ConfigError(f"--{relevance[0]} is drawn on the --html page only")
    if flow_budget is not None and not flow:
        raise ConfigError("--flow-budget is read with --flow only: it bounds the time flow may take")
    lines = sentences_or_input(sentences, input_)
    translator, cfg, checkpoint = open_for_attention(model, device, beam_size, int8 or None)
    n_layers, n_heads = attention_layout(cfg.model)
    for flag, given in (("--self", self_), *((f"--{name}", True) for name in relevance)):
        if given and "enc_self" not in n_layers:
            raise ConfigError(f"{flag}: a {cfg.model.arch} model has no self-attention to follow")
    kinds = ("cross", "enc_self", "dec_self") if self_ else ("cross",)
    if has_aligner(cfg) and layer is None and head is None:  # its alignment layer first: what align reads
        kinds, n_layers = ("align", *kinds), {**n_layers, "align": 1}
    kinds += tuple(relevance)
    if html is not None:
        budget = (FLOW_BUDGET if flow_budget is None else flow_budget) if flow else None
        _explore(translator, cfg, checkpoint, lines, limit, html, tgt, gold, one_based, kinds, budget)
        return
    layers = {kind: _check_number("--layer", layer, n_layers[kind], f"{KIND_TITLES[kind]} layers")
              for kind in kinds}
    options = HeatmapOptions(kinds, layers, _check_number("--head", head, n_heads, "attention heads"), words,
                             fmt.value, dpi)
    started = time.perf_counter()
    drawn = draw_attention(translator, itertools.islice(lines, limit), out, options)
    if drawn.sentences == 0:
        raise DataError("no sentences to draw")
    seconds = time.perf_counter() - started
    typer.echo(f"wrote {drawn.figures} figures of {drawn.sentences} sentence(s) to {out} in {seconds:.1f} s")
    if drawn.truncated:
        sys.stderr.write(f"warning: {drawn.truncated} line(s) "
                         "longer than decode.max_src_len pieces were truncated\n")


def _check_plot_options(out: Path | None, html: Path | None, tgt: Path | None, gold: Path | None,
                        layer: int | None, head: int | None, words: bool) -> None:
    """The options of ``plot`` that do not go together, refused before a model loads."""
    if (out is None) == (html is None):
        raise ConfigError("give --out FOLDER (figures) or --html FILE (one explorer page)")
    if html is None and (tgt is not None or gold is not None):
        raise ConfigError(f"{'--tgt' if tgt is not None else '--gold'} is read with --html only")
    if html is not None:
        chosen = [flag for flag, value in (("--layer", layer), ("--head", head), ("--words", words)) if value]
        if chosen:
            raise ConfigError(f"{chosen[0]}: the --html page holds every layer and head, pieces and words, "
                              "and chooses among them itself")
    if gold is not None and tgt is None:
        raise ConfigError("--gold needs --tgt: gold links refer to the target sentences they were made for")


def _explore(translator, cfg, checkpoint: Path, lines, limit, html: Path, tgt: Path | None, gold: Path | None,
             one_based: bool, kinds, flow_budget: float | None) -> None:
    """``plot --html``: read the sources (and targets, gold), write the explorer page. With --flow
    (``flow_budget`` seconds), the page's flow time is estimated before translating, and again from the
    translations' lengths before reading any attention."""
    from ..data.readers import read_lines
    from ..insight.exploring import explore
    from ..insight.links import read_gold
    from ..insight.reading import default_align_options

    sources = list(itertools.islice(lines, limit))
    if not sources:
        raise DataError("no sentences to draw")
    targets = None
    if tgt is not None:
        targets = list(itertools.islice(read_lines(tgt), limit))
        if len(targets) != len(sources):
            raise DataError(f"{tgt} has {len(targets)} lines, but there are {len(sources)} sources"
                            + (f" (--limit {limit})" if limit else ""))
    gold_links = read_gold(gold, len(sources), tgt, one_based, limit) if gold is not None else None
    started = time.perf_counter()
    if flow_budget is not None:
        _check_flow_time(translator, cfg, sources, targets, flow_budget)
        if targets is None:
            targets = translator.best(sources)
            _check_flow_time(translator, cfg, sources, targets, flow_budget)
    options = default_align_options(cfg, checkpoint)
    done = explore(translator, sources, html, targets, kinds, options, gold_links, f"attnmt: {html.stem}")
    seconds = time.perf_counter() - started
    typer.echo(f"wrote {html} ({done.bytes / 1024:,.0f} KB): {done.sentences} sentence(s) in {seconds:.1f} s")


# plot --flow's time bound, in seconds, without --flow-budget (see options.Flow for what it covers).
FLOW_BUDGET = 30.0


def _check_flow_time(translator, cfg, sources: list[str], targets: list[str] | None, budget: float) -> None:
    """``plot --flow``: a ConfigError when attention flow on these pairs would take longer than ``budget``
    seconds by ``rollout.flow_seconds`` (pieces with EOS/BOS, the model's layers); without targets, each
    translation is taken to be as long as its source."""
    from ..insight.rollout import flow_seconds
    from ..models import attention_layout

    layers, _ = attention_layout(cfg.model)
    tokenizer = translator.tokenizer
    prefix = len(tokenizer.encode_src([translator.source_prefix])[0]) if translator.source_prefix else 0
    src = [len(ids) + prefix + 1 for ids in tokenizer.encode_src(sources)]
    tgt = [len(ids) + 1 for ids in tokenizer.encode_tgt(targets)] if targets is not None else src
    seconds = sum(flow_seconds(S, T, layers["enc_self"], layers["dec_self"]) for S, T in zip(src, tgt))
    if seconds <= budget:
        return
    i = max(range(len(src)), key=lambda k: src[k] * tgt[k])
    target = f"{tgt[i]} target pieces" if targets is not None else "a translation taken to be as long"
    raise ConfigError(
        f"--flow: attention flow on {len(src)} sentence(s) would take about {seconds:.1f} s by estimate, "
        f"past --flow-budget {budget:g} (the longest, sentence {i + 1}: {src[i]} source pieces and {target}, "
        f"through {layers['enc_self']} + {layers['dec_self']} layers; the time grows as the fourth power of "
        f"a sentence's length): pass --flow-budget {math.ceil(seconds)} to draw it anyway, "
        "or give fewer or shorter sentences")


def _reverse_model(model: Path, cfg, reverse: Path, device, beam_size, int8: bool | None):
    """``align --reverse``: the reverse model and its config, checked to translate the other way."""
    back, back_cfg, back_checkpoint = open_for_attention(reverse, device, beam_size, int8)
    forward_pair = (cfg.data.src_lang, cfg.data.tgt_lang)
    backward_pair = (back_cfg.data.src_lang, back_cfg.data.tgt_lang)
    if backward_pair != forward_pair[::-1]:
        raise ConfigError(f"--reverse {reverse}: it translates {'->'.join(backward_pair)}, but the "
                          f"reverse of {model} ({'->'.join(forward_pair)}) is "
                          f"{'->'.join(forward_pair[::-1])}")
    return back, back_cfg, back_checkpoint


def _calibrate(translator, cfg, checkpoint: Path, sources, targets, gold_path: Path, src: Path,
               one_based: bool, reading: dict) -> None:
    """``align --calibrate``: every reading's AER on the dev set, the best stored in the run folder."""
    from ..insight.links import AlignOptions, calibration_file, read_gold
    from ..insight.reading import calibrate
    from ..runfiles import atomic_write_text

    path = calibration_file(checkpoint)
    if path is None:
        raise ConfigError(f"--calibrate stores its choice in the run folder, but {checkpoint} is not in one "
                          "(RUN/checkpoints/)")
    gold = read_gold(gold_path, len(sources), src, one_based)
    options = AlignOptions(shift=reading["shift"], method=reading["method"], threshold=reading["threshold"],
                           words=reading["words"])
    found = calibrate(translator, sources, targets, gold, options)
    label = lambda layer, heads: (("avg" if layer is None else str(layer + 1)) + " / "  # noqa: E731
                                  + ("all" if heads is None else ",".join(str(h + 1) for h in heads)))
    for layer, heads, aer in found.candidates[:10]:
        typer.echo(f"layer / heads {label(layer, heads):<16} AER {aer:.4f}")
    record = {"layer": found.layer, "heads": list(found.heads) if found.heads is not None else None,
              "aer": round(found.aer, 6), "gold": str(gold_path), "sentences": len(sources),
              "checkpoint": checkpoint.name, "method": reading["method"], "shift": reading["shift"],
              "words": reading["words"], "candidates": len(found.candidates)}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    typer.echo(f"chose layer / heads {label(found.layer, found.heads)} (AER {found.aer:.4f} on "
               f"{len(sources)} pairs, 1-based); wrote {path}")


@command(inputs=("model", "src", "tgt", "gold", "reverse", "calibrate_"),
         outputs={"output": Output(), "hyp_out": Output()})
def align(model: ModelArg, src: opt.Src, tgt: opt.AlignTgt = None, gold: opt.AlignGold = None,
          layer: opt.AlignLayer = None, heads: opt.AlignHeads = None, shift: opt.Shift = False,
          method: opt.Method = "mutual", reverse: opt.Reverse = None, symmetrize_: opt.Symmetrize = None,
          word_rule: opt.Words = "merged", threshold: opt.Threshold = 0.3,
          one_based: opt.AlignOneBased = False, output: opt.AlignOutput = None, hyp_out: opt.HypOut = None,
          json_: opt.ScoresJson = False, calibrate_: opt.Calibrate = None, from_: opt.From = "attention",
          full_context: opt.FullContext = None, one_way: opt.OneWay = False, steps: StepsOpt = 64,
          beam_size: BeamOpt = None, int8: Int8Opt = False, device: DeviceOpt = "auto") -> None:
    """Word alignments from cross-attention under teacher forcing, in Pharaoh format (one line per pair).

    Words are the space-separated tokens of each line; the attention over a word's pieces is merged
    (source pieces summed, target pieces averaged). By default every layer and head is averaged (the
    EOS column masked) and a link is kept where it is the argmax in both directions (--method mutual).
    With --reverse MODEL, a model trained the other way aligns too and --symmetrize combines the two (a
    run folder that names its reverse model in reverse.json is aligned both ways unless --one-way). A model
    taught with train.alignment.full_context is read in the pass where each piece sees the whole target.
    With --gold, print AER, precision and recall (Och & Ney 2003); the alignments are then written
    only with --output.
    """
    from ..insight.links import alignment_scores, format_pharaoh, read_gold, read_reverse
    from ..insight.reading import align_corpus

    if full_context is not None and from_.value != "attention":
        flag = "--full-context" if full_context else "--causal"
        raise ConfigError(f"{flag} chooses which attention is read; --from {from_.value} reads no attention")
    named = None  # the reverse model a run's reverse.json names, said once it has loaded (else one line)
    if reverse is None and not one_way and calibrate_ is None:
        reverse = named = read_reverse(model)
        if reverse is not None and not reverse.exists():
            sys.stderr.write(f"warning: reverse.json names {reverse}, which is not there: aligning one way\n")
            reverse = named = None
    check_request(AlignRequest(tgt, gold, hyp_out, output, layer, heads, shift, threshold, reverse,
                               symmetrize_.value if symmetrize_ is not None else None, from_.value,
                               calibrate_))
    sources, targets = read_pairs(src, tgt)
    gold_links = read_gold(gold, len(sources), src, one_based) if gold is not None else None
    translator, cfg, checkpoint = open_for_attention(model, device, beam_size, int8 or None)
    reading = {"shift": shift, "method": method.value, "threshold": threshold,
               "symmetrize": (symmetrize_ or Symmetrization.grow_diag_final_and).value,
               "words": word_rule.value, "source": from_.value, "steps": steps}
    if full_context is not None:
        reading["full_context"] = full_context
    if calibrate_ is not None:
        return _calibrate(translator, cfg, checkpoint, sources, targets, calibrate_, src, one_based, reading)
    given = (layer, heads)  # each model read with its own defaults where these are None
    layer, heads, options = model_reading(cfg, *given, "", checkpoint, **reading)
    back, back_options = _reverse_reading(model, cfg, reverse, device, beam_size, reading, *given,
                                          int8=int8 or None)
    if named is not None:
        sys.stderr.write(f"aligning both ways, with the reverse model {named} (reverse.json; --one-way for "
                         "one direction)\n")
    if targets is None:  # the model's own translations, kept (--hyp-out) before the alignment's work
        targets = _own_translations(translator, sources, hyp_out)
    with FileProgress(len(sources) * (2 if back is not None else 1), "aligning") as progress:
        aligned = align_corpus(translator, sources, targets, options, gold_links, back, back_options,
                               progress.advance)
    if output is not None or gold is None:
        write_output(output, "".join(format_pharaoh(links, one_based) + "\n" for links in aligned.links))
    if gold_links is not None:
        score = alignment_scores(aligned.links, gold_links.sure, gold_links.possible)
        _print_score(score, json_, src, layer, heads, reading, reverse, options.full_context)


def _reverse_reading(model: Path, cfg, reverse: Path | None, device, beam_size, reading: dict,
                     layer: Layer | None, heads: Heads | None, int8: bool | None = None):
    """``align --reverse``: the reverse model and how it is read (``layer`` and ``heads`` as given, its own
    defaults where they are None: a guided model at its taught head); (None, None) without it."""
    if reverse is None:
        return None, None
    back, back_cfg, back_checkpoint = _reverse_model(model, cfg, reverse, device, beam_size, int8)
    return back, model_reading(back_cfg, layer, heads, "--reverse ", back_checkpoint, **reading)[2]


def _own_translations(translator, sources: list[str], hyp_out: Path | None) -> list[str]:
    """The model's own translations of ``sources``, written to ``hyp_out`` first if given."""
    from ..runfiles import atomic_write_text

    targets = translator.best(sources)
    if hyp_out is not None:
        atomic_write_text(hyp_out, "".join(t + "\n" for t in targets))
    return targets


def _print_score(score, json_: bool, src: Path, layer: Layer, heads: Heads, reading: dict,
                 reverse: Path | None, full_context: bool) -> None:
    """``align --gold``'s scores, as a table or as JSON, with the reading they are of."""
    from .reporting import print_alignment_score

    symmetrization = reading["symmetrize"] if reverse is not None else None
    if json_:
        typer.echo(json.dumps({**score.as_dict(), "layer": layer.text, "heads": heads.text,
                               **{key: reading[key] for key in ("shift", "method", "words")},
                               "from": reading["source"], "symmetrize": symmetrization,
                               "full_context": full_context, "reverse": str(reverse) if reverse else None}))
        return
    how = f"layer {layer.text}, heads {heads.text}" if reading["source"] == "attention" else reading["source"]
    how += ", full context" if full_context else ""
    how += (f", {reading['method']}" + (", shifted" if reading["shift"] else "")
            + (f", {symmetrization} with {reverse}" if reverse is not None else ""))
    print_alignment_score(score, f"alignment of {src} ({how})")


@command("plot-curves", inputs=("run_dir",), outputs={"out": Output(own=("curves.png",))})
def plot_curves(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (its metrics.jsonl, and plots/ for --gif).",
                                            show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o",
                                             help="The PNG to write (default: RUN_DIR/curves.png).")] = None,
    gif: Annotated[bool, typer.Option("--gif", help="Also animate the heatmaps written during training "
                                      "(train.plot_every) as GIFs.")] = False,
) -> None:
    """Training curves (train loss, dev loss, dev BLEU and chrF against the step) as one PNG."""
    from ..insight.curves import animate_run, run_curves

    typer.echo(f"wrote {run_curves(run_dir, out)}")
    if gif:
        for animation, frames in animate_run(run_dir):
            typer.echo(f"wrote {animation} ({frames} frames)")

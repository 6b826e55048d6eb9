"""``heads``: every layer and head of a Transformer explained: its pattern (``head_patterns.py``) and its
importance (``heads.py``), as a table, JSON and an HTML page (``heads_page.py``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError, DataError
from .app import command
from .common import FileProgress, open_for_attention, read_pairs, write_output
from .contract import Output
from .options import DeviceOpt, ModelArg


@command(inputs=("model", "src", "tgt"), outputs={"json_path": Output(), "html": Output()})
def heads(
    model: ModelArg,
    src: Annotated[Path, typer.Option("--src", help="Source sentences, one per line.", show_default=False)],
    tgt: Annotated[Path | None, typer.Option("--tgt", help="Their translations: teacher forcing and BLEU "
                                             "on these (default: the model's own translations).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N pairs.")] = None,
    sentence: Annotated[int, typer.Option("--sentence", min=1, help="The pair whose maps --html draws "
                                          "(1 = the first).")] = 1,
    bleu: Annotated[bool, typer.Option("--bleu/--no-bleu", help="Decode once per head for its BLEU change "
                                       "(--no-bleu: the loss change only; pruning still decodes).")] = True,
    random_draws: Annotated[int, typer.Option("--random-draws", min=0, max=1000, help="Random prunings of "
                                              "25% of the heads to compare with.")] = 5,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1,
                                      help="Seed of the random prunings.")] = 0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write everything as JSON here (- for "
                                                   "standard output; the table goes to stderr).")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write a page with a heatmap per head, coloured "
                                              "by pattern, and the table.", show_default=False)] = None,
    beam_size: Annotated[int, typer.Option("--beam-size", min=1, help="Beam size of every decode "
                                           "(1: greedy).")] = 1,
    device: DeviceOpt = "auto",
) -> None:
    """Every layer and head of a Transformer: what it attends to and how much the model needs it.

    [b]Pattern[/b]: means over every query row i of every pair, under teacher forcing;
    p(i) = i in self-attention, round(i (S-1) / (T-1)) in cross-attention. The first that holds:
    - [b]diagonal[/b] / [b]previous[/b] / [b]next[/b]: weight on key p(i) / p(i)-1 / p(i)+1 >= 0.5
      (the best of the three);
    - [b]stripe[/b]: mass on BOS, EOS and punctuation pieces >= 0.5;
    - [b]block[/b]: mass m within |j - p(i)| <= 3 above chance, (m - u) / (1 - u) with u the window's
      share of the keys, >= 0.5 (rows whose window holds every key left out);
    - [b]dispersed[/b]: entropy / log(visible keys) >= 0.7;
    - else [b]long-range[/b], scored by the mass outside that window.
    Also each head's confidence (mean max weight) and entropy in nats (Voita et al. 2019).

    [b]Importance[/b] (Michel et al. 2019): the change in loss per target token and in BLEU with the
    head alone masked (its slice of the attention output times 0); BLEU against --tgt, else against
    the unmasked model's own translations. Then the BLEU with the 10%, 25% and 50% least important
    heads (by the loss change) masked together, beside the mean of --random-draws random 25%.
    Cost: a forward pass per head, a decode per head (unless --no-bleu) and per pruning.
    Transformers only (an LSTM is refused).
    """
    from ..insight.heads import HeadsOptions, explain_heads, head_ids, model_pairs, planned_passes
    from ..insight.heads_page import write_heads_page

    sources, targets = _read(src, tgt, limit, sentence)
    started = time.perf_counter()
    translator, cfg, checkpoint = open_for_attention(model, device, beam_size, int8=False)
    ids = head_ids(translator.model)  # a ConfigError for anything but a Transformer
    pairs = model_pairs(translator, sources, targets)  # without --tgt: the model's own translations
    if sentence - 1 not in pairs.lines:
        raise DataError(f"--sentence {sentence}: line {sentence} of {src} is empty")
    options = HeadsOptions(bleu=bleu, random_draws=random_draws, seed=seed,
                           sample=pairs.lines.index(sentence - 1))
    with FileProgress(planned_passes(len(ids), options) * len(pairs), "heads") as progress:
        report = explain_heads(translator, pairs, cfg.data.tgt_lang, options, progress.advance)
    seconds = time.perf_counter() - started
    to_stdout = json_path is not None and str(json_path) == "-"
    _show(report, seconds, sys.stderr if to_stdout else sys.stdout)
    if json_path is not None:
        write_output(None if to_stdout else json_path, json.dumps(report.as_dict(), indent=1) + "\n")
    if html is not None:
        size = write_heads_page(html, report.as_dict(), report.sample, f"attnmt heads: {checkpoint}")
        typer.echo(f"wrote {html} ({size / 1024:,.0f} KB)", err=to_stdout)


def _read(src: Path, tgt: Path | None, limit: int | None,
          sentence: int) -> tuple[list[str], list[str] | None]:
    """The first ``limit`` pairs; a DataError when there are none, a ConfigError when --sentence is past
    them."""
    sources, targets = read_pairs(src, tgt)
    if limit is not None:
        sources, targets = sources[:limit], (targets[:limit] if targets is not None else None)
    if not sources:
        raise DataError(f"{src}: no sentences")
    if sentence > len(sources):
        raise ConfigError(f"--sentence {sentence}: the input has {len(sources)} sentence(s)")
    return sources, targets


def _heads(n: int) -> str:
    return f"{n} head" if n == 1 else f"{n} heads"


def _signed(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def _show(report, seconds: float, stream) -> None:
    """The table of every head, the pattern counts per kind and the pruning lines."""
    from rich.console import Console
    from rich.table import Table

    from ..insight.head_patterns import KIND_NAMES, PATTERNS

    console = Console(file=stream, width=max(Console(file=stream).width, 100))
    table = Table(title="every head", title_justify="left")
    for name in ("layer", "kind", "head", "pattern", "score", "confidence", "entropy", "Δloss", "ΔBLEU"):
        table.add_column(name, justify="left" if name in ("kind", "pattern") else "right")
    for h in report.heads:
        s = h.scores
        table.add_row(str(h.layer + 1), KIND_NAMES[h.kind], str(h.head + 1), s.pattern, f"{s.score:.3f}",
                      f"{s.confidence:.3f}", f"{s.entropy:.3f}", _signed(h.delta_loss, 4),
                      _signed(h.delta_bleu, 2))
    console.print(table)
    counts = Table(title="patterns per kind", title_justify="left")
    counts.add_column("kind")
    for pattern in PATTERNS:
        counts.add_column(pattern, justify="right")
    for kind, found in report.counts().items():
        counts.add_row(KIND_NAMES[kind], *(str(found[p]) for p in PATTERNS))
    console.print(counts)
    references = "the model's own translations" if report.own else "the targets"
    console.print(f"{report.pairs} pairs, {report.tokens} target tokens, BLEU against {references}, beam "
                  f"{report.beam_size}: unmasked BLEU {report.bleu:.2f}, loss {report.loss:.4f} per token",
                  highlight=False)
    for p in report.pruned:
        console.print(f"pruned {p.fraction:.0%} by importance ({_heads(len(p.heads))}): BLEU {p.bleu:.2f} "
                      f"({p.bleu - report.bleu:+.2f}), loss {p.loss:.4f}", highlight=False)
    if report.random:
        draws = ", ".join(f"{r.bleu:.2f}" for r in report.random)
        first = report.random[0]
        console.print(f"pruned {first.fraction:.0%} at random ({_heads(len(first.heads))}, "
                      f"mean of {len(report.random)}): BLEU {report.random_bleu:.2f} "
                      f"({report.random_bleu - report.bleu:+.2f}; draws {draws})", highlight=False)
    console.print(f"{len(report.heads)} heads in {seconds:.1f} s", highlight=False)

"""``attribute``: gradient attribution beside attention (``attribution.py``, through
``exploring.attribute_corpus``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import DataError
from ..insight.link_request import check_source
from .app import command
from .common import FileProgress, open_for_attention, read_pairs, write_output
from .contract import Output
from .options import AttributionMethod, BeamOpt, DeviceOpt, ModelArg, StepsOpt


@command(inputs=("model", "src", "tgt"), outputs={"output": Output(), "html": Output()})
def attribute(
    model: ModelArg,
    src: Annotated[Path, typer.Option("--src", help="Source sentences, one per line.", show_default=False)],
    tgt: Annotated[Path | None, typer.Option("--tgt", help="Target sentences to attribute "
                                             "(default: the model's own translations).")] = None,
    method: Annotated[AttributionMethod, typer.Option("--method", help="saliency: |gradient|; "
                                                      "input_x_gradient; integrated_gradients (from zero "
                                                      "embeddings); attention: cross-attention, every layer "
                                                      "and head averaged; alti: ALTI+, contributions through "
                                                      "the whole Transformer, one forward pass, no "
                                                      "captum.")] = "integrated_gradients",
    steps: StepsOpt = 64,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N pairs.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON lines here "
                                                "(atomically; default: standard output, unless "
                                                "--html).")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write the explorer page with the attribution "
                                              "beside the attention.", show_default=False)] = None,
    beam_size: BeamOpt = None,
    device: DeviceOpt = "auto",
    workers: Annotated[int | None, typer.Option(
        min=1, max=1024, help="Processes that attribute on the CPU (default: one per core).")] = None,
) -> None:
    """For each target piece, the share of each source piece and of the target prefix in its prediction.

    Gradient attribution (captum: pip install 'attnmt\\[attribute]') of log p(target piece) with respect to
    the embeddings; a token's score is the L2 norm of its attribution, and each row's scores are shares
    summing to 1. --method alti (Ferrando et al. 2022) follows each piece's contribution through attention,
    residuals and layer norms instead, without gradients. One JSON object per pair: number, method, src,
    tgt, tgt_in (pieces), source (a row per target piece: the share of each source piece), prefix (the share
    of each decoder input), source_share (per target piece: the source's share in its prediction), and for
    integrated gradients delta (per row: the attributions' sum minus the output difference) and gap (the
    output difference).
    """
    from ..insight.exploring import attribute_corpus, explore
    from ..insight.reading import default_align_options

    check_source(method.value, None, None, False)  # captum, unless the method is attention
    sources, targets = read_pairs(src, tgt)
    if limit is not None:
        sources, targets = sources[:limit], (targets[:limit] if targets is not None else None)
    if not sources:
        raise DataError(f"{src}: no sentences to attribute")
    translator, cfg, checkpoint = open_for_attention(model, device, beam_size, int8=False)
    started = time.perf_counter()
    with FileProgress(len(sources), "attributing") as progress:
        done = attribute_corpus(translator, sources, targets, method.value, steps, progress.advance, workers)
    if html is not None:
        options = default_align_options(cfg, checkpoint)
        page = explore(translator, sources, html, done.targets, options=options,
                       title=f"attnmt: {html.stem} ({method.value})", attribution=done)
        seconds = time.perf_counter() - started
        typer.echo(f"wrote {html} ({page.bytes / 1024:,.0f} KB): {page.sentences} sentence(s) in "
                   f"{seconds:.1f} s")
    if output is not None or html is None:
        records = _attribution_records(done)
        write_output(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _attribution_records(done) -> list[dict]:
    """``attribute``'s JSON objects, one per pair (an empty line: empty lists)."""
    def rows(matrix):
        return [[round(float(x), 6) for x in row] for row in matrix]

    records = []
    for number, (src, tgt, found) in enumerate(zip(done.src, done.tgt, done.found), start=1):
        record = {"number": number, "method": done.method, "src": src, "tgt": tgt,
                  "tgt_in": ["<s>"] + tgt[:-1], "source": [], "prefix": []}
        if found is not None:
            record.update(source=rows(found.source), prefix=rows(found.prefix),
                          source_share=[round(float(x), 6) for x in found.source.sum(1)])
            if found.delta is not None:
                record.update(delta=[round(float(x), 6) for x in found.delta],
                              gap=[round(float(x), 6) for x in found.gap])
        records.append(record)
    return records

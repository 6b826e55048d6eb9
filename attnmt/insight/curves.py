"""Training curves and animations: a run's ``metrics.jsonl`` as a figure, its training-time heatmaps as GIFs.

Strings, files and arrays only: no model code, no torch. Figures are drawn by the Agg canvas (nothing
touches pyplot or ``rcParams``) and written through ``plot.save_figure`` / ``runfiles.atomic_write_bytes``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..config.jsonfile import read_json_lines
from ..errors import ConfigError, DataError
from ..runfiles import RunDir, atomic_write_bytes
from .plot import FONT_SIZE, save_figure


def read_metrics(path: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl``; a line that is not a JSON object (say, a half-written
    last line of a live run) is skipped."""
    return read_json_lines(path, DataError, skip_bad=True)


def curves_figure(records: Sequence[dict], title: str = "") -> Figure:
    """Train loss and dev loss (left), dev BLEU and chrF (right) against the step; with gold alignments of
    the dev set (the toy task), the dev AER beside them (right, its own axis, in %)."""

    def series(event: str, key: str) -> tuple[list[float], list[float]]:
        # An average's validation (train.average_last) is not a point of the curve.
        points = [(r["step"], r[key]) for r in records
                  if r.get("event") == event and not r.get("averaged")
                  and isinstance(r.get(key), (int, float))
                  and isinstance(r.get("step"), (int, float))]
        return [p[0] for p in points], [p[1] for p in points]

    train_loss, dev_loss = series("train", "loss"), series("valid", "loss")
    bleu, chrf, aer = series("valid", "bleu"), series("valid", "chrf"), series("valid", "aer")
    if not train_loss[0] and not dev_loss[0]:
        raise ValueError("no train or valid records with a step and a loss")
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot(*train_loss, label="train loss", linewidth=1)
    if dev_loss[0]:
        left.plot(*dev_loss, "o-", label="dev loss", markersize=3)
    left.set_xlabel("step")
    left.set_ylabel("loss (label-smoothed, per token)")
    left.legend(fontsize=FONT_SIZE)
    left.grid(alpha=0.3)
    if bleu[0]:
        right.plot(*bleu, "o-", label="dev BLEU", markersize=3)
        right.plot(*chrf, "s-", label="dev chrF", markersize=3)
        handles, labels = right.get_legend_handles_labels()
        if aer[0]:
            twin = right.twinx()
            (line,) = twin.plot(aer[0], [100 * a for a in aer[1]], "^--", color="tab:red", label="dev AER",
                                markersize=3)
            twin.set_ylabel("dev AER (%)")
            twin.set_ylim(bottom=0)
            handles, labels = handles + [line], labels + ["dev AER"]
        right.legend(handles, labels, fontsize=FONT_SIZE)
    else:
        right.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=right.transAxes)
    right.set_xlabel("step")
    right.set_ylabel("score")
    right.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=FONT_SIZE + 2, parse_math=False)
    edge = 0.93 if bleu[0] and aer[0] else 0.98  # the dev AER's own axis has its tick labels on the right
    fig.subplots_adjust(left=0.08, right=edge, bottom=0.13, top=0.9 if title else 0.95, wspace=0.25)
    return fig


def assemble(frames: Sequence[Path], out: Path, duration_ms: int = 600) -> Path:
    """Heatmap PNGs (say, one per validation) into an animated GIF (``out`` ending in .gif) or a
    horizontal strip (any other suffix, written as PNG); frames of other sizes are padded with white."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to assemble")
    images = []
    for frame in frames:
        with Image.open(frame) as image:
            images.append(image.convert("RGB"))
    out = Path(out)
    buffer = io.BytesIO()
    if out.suffix.lower() == ".gif":
        width, height = max(i.width for i in images), max(i.height for i in images)
        padded = []
        for image in images:
            canvas = Image.new("RGB", (width, height), "white")
            canvas.paste(image, (0, 0))
            padded.append(canvas)
        padded[0].save(buffer, format="GIF", save_all=True, append_images=padded[1:], duration=duration_ms,
                       loop=0)
    else:
        width, height = sum(i.width for i in images), max(i.height for i in images)
        strip = Image.new("RGB", (width, height), "white")
        x = 0
        for image in images:
            strip.paste(image, (x, 0))
            x += image.width
        strip.save(buffer, format="PNG")
    atomic_write_bytes(out, buffer.getvalue(), durable=False)
    return out


def run_curves(run_dir: Path, out: Path | None = None) -> Path:
    """``attnmt plot-curves``: the curves of a run folder's ``metrics.jsonl`` written as a PNG to ``out``
    (default ``RUN/curves.png``)."""
    run = RunDir(Path(run_dir))
    if not run.root.is_dir():
        raise DataError(f"{run_dir}: no such run folder")
    if not run.metrics.is_file():
        raise DataError(f"{run.metrics}: not found (has this run trained yet?)")
    try:
        fig = curves_figure(read_metrics(run.metrics), title=str(run.root.name))
    except ValueError as e:
        raise DataError(f"{run.metrics}: {e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{run.metrics}: invalid UTF-8 at byte offset {e.start}") from None
    target = out if out is not None else run.root / "curves.png"
    if target.is_dir():
        raise ConfigError(f"--out {target} is a folder; give a file name")
    return save_figure(fig, target, "png")


def animate_run(run_dir: Path) -> list[tuple[Path, int]]:
    """The heatmaps drawn during training (``RUN/plots/step_*/NAME.png``) as one GIF per NAME in
    ``RUN/plots``; returns (file, frames) of each."""
    plots = Path(run_dir) / "plots"
    frames: dict[str, list[Path]] = {}
    for step_dir in sorted(plots.glob("step_*")):
        for png in sorted(step_dir.glob("*.png")):
            frames.setdefault(png.name, []).append(png)
    if not frames:
        raise DataError(f"{plots}: no heatmaps from training (train them with --set train.plot_every=1)")
    return [(assemble(paths, plots / (Path(name).stem + ".gif")), len(paths))
            for name, paths in frames.items()]

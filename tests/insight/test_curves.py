"""curves.py on its own: a run's metrics.jsonl as curves, heatmaps assembled into a GIF or a strip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from attnmt.insight import curves, plot


def test_curves_from_metrics_and_heatmaps_assembled(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    records = [{"event": "train", "step": s, "loss": 5 - s / 10} for s in range(1, 30)]
    records += [{"event": "valid", "step": s, "loss": 4 - s / 20, "bleu": s, "chrf": 2 * s}
                for s in (10, 20, 30)]
    metrics.write_text("\n".join(map(json.dumps, records)) + "\n{half a line", encoding="utf-8")
    fig = curves.curves_figure(curves.read_metrics(metrics))
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["train loss", "dev loss"]
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["dev BLEU", "dev chrF"]
    with Image.open(plot.save_figure(fig, tmp_path / "curves.png")) as image:
        assert image.size == (1000, 400)
    with pytest.raises(ValueError, match="no train or valid"):
        curves.curves_figure([{"event": "start"}])
    assert len(fig.axes) == 2  # no AER recorded: no AER axis

    # With dev AER recorded (gold alignments of the dev set), it is drawn beside BLEU, in %, on its own axis.
    records = [{**r, "aer": 0.5 / r["step"]} if r["event"] == "valid" else r for r in records]
    fig = curves.curves_figure(records)
    (aer,) = fig.axes[2].get_lines()
    assert aer.get_label() == "dev AER" and list(aer.get_xdata()) == [10, 20, 30]
    np.testing.assert_allclose(aer.get_ydata(), [5.0, 2.5, 100 * 0.5 / 30])
    assert "dev AER" in [t.get_text() for t in fig.axes[1].get_legend().get_texts()]

    frames = []
    for k, n in enumerate((3, 5)):  # frames of different sizes
        frames.append(
            plot.save_figure(plot.attention_figure(np.eye(n), list("abcde")[:n], list("vwxyz")[:n]),
                             tmp_path / f"{k}.png", dpi=30)
        )
    with Image.open(curves.assemble(frames, tmp_path / "anim.gif")) as gif:
        assert gif.n_frames == 2
    sizes = [Image.open(f).size for f in frames]
    with Image.open(curves.assemble(frames, tmp_path / "strip.png")) as strip:
        assert strip.size == (sum(w for w, _ in sizes), max(h for _, h in sizes))

"""The report of ``attnmt study`` from its ``results.json``: ``report.md``, ``report.html`` (one offline page:
the figures embedded as ``data:`` images, no script, a Content-Security-Policy that loads nothing) and the
figures under ``figures/``: BLEU over training minutes, the kernels' time and memory against length
(log-log), and the same dev sentence's attention under every variant. No torch here."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..runfiles import atomic_write_text
from .growth import exponent_rows

FIGURES = {"curve": "bleu_over_minutes.png", "growth": "growth.png", "cross": "attention_cross.png",
           "enc_self": "attention_enc_self.png"}


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def quality_rows(results: dict[str, Any], order: Sequence[str]) -> list[list[str]]:
    """One row per finished variant, in the order asked for."""
    rows = []
    for name in [n for n in order if n in results["variants"]] or list(results["variants"]):
        r = results["variants"][name]
        rows.append([name, r["label"], _fmt(r.get("parameters"), ","), str(r.get("steps", "-")),
                     _fmt(r["dev"]["bleu"]), _fmt(r["dev"]["chrf"]), _fmt(r["test"]["bleu"]),
                     _fmt(r["test"]["chrf"]), _fmt(r.get("train_tokens_per_s"), ",.0f"),
                     _fmt(r.get("decode_sentences_per_s"), ".1f"), _fmt(r.get("peak_rss_mib"), ",.0f")])
    return rows


QUALITY_HEAD = ["variant", "what", "parameters", "steps", "dev BLEU", "dev chrF", "test BLEU", "test chrF",
                "train tokens/s", "decode sentences/s", "peak MiB"]
GROWTH_HEAD = ["kernel", "claimed", "time exponent", "fwd+bwd", "memory exponent", "fwd+bwd",
               "time within 0.25"]


def growth_rows(results: dict[str, Any]) -> list[list[str]]:
    return [[row["kernel"], row["claimed"], _fmt(row["time"]), _fmt(row["time_backward"]),
             _fmt(row["memory"]), _fmt(row["memory_backward"]),
             {None: "-", True: "yes", False: "no"}[row["within"]]]
            for row in exponent_rows(results.get("growth", {}))]


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(head: list[str], rows: list[list[str]], table_id: str) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def draw_curves(results: dict[str, Any], path: Path) -> Path | None:
    """Dev BLEU against training minutes, one line per variant."""
    from ..insight.plot import save_figure

    variants = {name: r for name, r in results["variants"].items() if r.get("curve")}
    if not variants:
        return None
    fig = _figure(6.5, 4.0)
    ax = fig.add_subplot()
    for name, r in variants.items():
        ax.plot([p[0] for p in r["curve"]], [p[1] for p in r["curve"]], marker="o", markersize=3, label=name)
    ax.set_xlabel("training minutes")
    ax.set_ylabel("dev BLEU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def draw_growth(growth: dict[str, Any], path: Path) -> Path | None:
    """Time and peak memory of each kernel against length, log-log, forward and forward + backward."""
    from ..insight.plot import save_figure

    if not growth.get("values"):
        return None
    lengths = growth["lengths"]
    fig = _figure(10.0, 7.0)
    axes = fig.subplots(2, 2)
    for row, (what, unit) in enumerate((("ms", "time per call (ms)"), ("mib", "peak extra memory (MiB)"))):
        for col, mode in enumerate(("forward", "backward")):
            ax = axes[row][col]
            drawn = 0
            for kernel, by_mode in growth["values"].items():
                points = [(n, y) for n, y in zip(lengths, by_mode[mode][what]) if y is not None and y > 0]
                if points:
                    slope = growth["exponents"][kernel][mode][what]
                    label = f"{kernel} (slope {_fmt(slope)})"
                    ax.plot(*zip(*points), marker="o", markersize=3, label=label)
                    drawn += 1
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{'forward' if mode == 'forward' else 'forward + backward'}: {unit}", fontsize=9)
            ax.set_xlabel("sequence length n")
            ax.grid(alpha=0.3, which="both")
            if drawn:
                ax.legend(fontsize=6)
    fig.tight_layout()
    return save_figure(fig, path)


def draw_attention(results: dict[str, Any], kind: str, path: Path, order: Sequence[str]) -> Path | None:
    """The same dev sentence's attention (``kind``: cross or enc_self) under every variant that has it,
    side by side on one 0..1 scale."""
    from ..insight.plot import attention_figure, save_figure

    names = [n for n in order if n in results["variants"] and kind in results["variants"][n]["attention"]]
    if not names:
        return None
    first = results["variants"][names[0]]["attention"]
    panels = np.stack([np.asarray(results["variants"][n]["attention"][kind], dtype=np.float32)
                       for n in names])
    rows, cols = (first["tgt"], first["src"]) if kind == "cross" else (first["src"], first["src"])
    what = "last layer's cross-attention" if kind == "cross" else "first layer's encoder self-attention"
    fig = attention_figure(panels, cols, rows, names, f"dev sentence 1, {what}, heads averaged",
                           xlabel="source", ylabel="target" if kind == "cross" else "source")
    return save_figure(fig, path)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def draw_figures(root: Path, results: dict[str, Any], order: Sequence[str]) -> dict[str, Path]:
    folder = root / "figures"
    folder.mkdir(exist_ok=True)
    drawn = {"curve": draw_curves(results, folder / FIGURES["curve"]),
             "growth": draw_growth(results.get("growth", {}), folder / FIGURES["growth"]),
             "cross": draw_attention(results, "cross", folder / FIGURES["cross"], order),
             "enc_self": draw_attention(results, "enc_self", folder / FIGURES["enc_self"], order)}
    return {key: path for key, path in drawn.items() if path is not None}


CAPTIONS = {"curve": "Dev BLEU over training minutes",
            "growth": "Kernels alone: time and memory against length",
            "cross": "The same sentence's cross-attention under every variant",
            "enc_self": "The same sentence's encoder self-attention under every Transformer variant"}


def _summary(results: dict[str, Any]) -> str:
    machine = results.get("machine", {})
    settings = results.get("settings", {})
    return (f"Data: {settings.get('data', '?')}. Budget: {_fmt(settings.get('minutes'), 'g')} training "
            f"minutes per variant, seed {settings.get('seed', '?')}, one after the other; dev and test "
            f"decoded with beam {settings.get('beam_size', '?')}. Machine: {machine.get('cpu', '?')}, "
            f"{machine.get('cores', '?')} cores, torch {machine.get('torch', '?')}.")


def write_report(root: Path, results: dict[str, Any], order: Sequence[str]) -> list[Path]:
    """``report.md`` and ``report.html`` (and the figures) from the results so far."""
    figures = draw_figures(root, results, order)
    quality, growth = quality_rows(results, order), growth_rows(results)
    fit = results.get("growth", {}).get("fit_lengths")
    fit_text = f" (fitted over n = {fit[0]}..{fit[-1]})" if fit else ""
    md = ["# attnmt study", "", _summary(results), "", "## Quality and speed", "",
          _markdown_table(QUALITY_HEAD, quality), ""]
    if growth:
        md += [f"## Growth with length{fit_text}", "", _markdown_table(GROWTH_HEAD, growth), ""]
    md += [f"![{CAPTIONS[key]}](figures/{path.name})\n" for key, path in figures.items()]
    md_path = root / "report.md"
    atomic_write_text(md_path, "\n".join(md) + "\n")
    html_path = root / "report.html"
    atomic_write_text(html_path, _html_page(results, quality, growth, fit_text, figures))
    return [md_path, html_path]


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 20px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,td:nth-child(2),th{text-align:left}figure{margin:16px 0}
img{max-width:100%}figcaption{color:#555;font-size:13px}"""


def _html_page(results: dict[str, Any], quality: list[list[str]], growth: list[list[str]], fit_text: str,
               figures: dict[str, Path]) -> str:
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
             "style-src 'unsafe-inline'\">", "<title>attnmt study</title>",
             f"<style>{STYLE}</style></head><body>",
             "<h1>attnmt study</h1>", f"<p id=\"summary\">{html.escape(_summary(results))}</p>",
             "<h2>Quality and speed</h2>", _html_table(QUALITY_HEAD, quality, "quality")]
    if growth:
        parts += [f"<h2>Growth with length{html.escape(fit_text)}</h2>",
                  _html_table(GROWTH_HEAD, growth, "growth")]
    for key, path in figures.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'<figure id="figure-{key}"><img alt="{html.escape(CAPTIONS[key])}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{html.escape(CAPTIONS[key])}</figcaption>'
                     "</figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

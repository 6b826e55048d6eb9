"""The whole picture of decoding (``bench_decode.py --picture``): BLEU against sentences/s on test2016 for
trained models, each decoded the ways a user can choose, in one run.

    python scripts/bench/bench_decode.py --picture --models runs/teacher runs/student runs/student_tiny \
        --beams 1 5 --runs 3 --figure docs/img/decode_picture.png

Per model (``--models``; the first is the teacher): attnmt fp32 (the fast path, as ``attnmt translate``
decodes), ``--int8``, and ``--int8 --shortlist`` (the run folder's ``shortlist.pt``, made here with
``attnmt shortlist`` when it has none); for the first model also CTranslate2 float32 and int8 (``attnmt
export``, decoded through ``attnmt translate EXPORT``'s own wrapper). Each engine at each beam width: the
1,000 test_2016_flickr sentences through ``Translator.translate`` (cleaning, encoding, batches by
``decode.max_tokens``, detokenising: what ``attnmt translate`` runs after start-up), after a warm-up of the
first 64, each pass in a fresh process of its own (CTranslate2's OpenMP threads slow whatever runs after
them in a process), ``--runs`` rounds that alternate the order; sentences/s is the median over rounds, BLEU
(sacrebleu, its default 13a tokenisation, against the English references) comes from the outputs.
Ratios: each row against the teacher's fp32 at the same beam, and attnmt int8 against CTranslate2 int8.
``--figure``: BLEU against sentences/s, one marker per row, drawn with matplotlib.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REF_NAME = "test_2016_flickr.en.gz"


@dataclass(frozen=True)
class Engine:
    """One way to decode: a model (a run folder, or an export folder), and the options that change it."""

    label: str
    model: str
    beam: int
    int8: bool = False
    shortlist: str | None = None


def engines(models: list[Path], beams: list[int], exports: dict[str, Path]) -> list[Engine]:
    """Every row of the picture (module docstring), the shortlists made where a run has none."""
    found = []
    for k, model in enumerate(models):
        listed = model / "shortlist.pt"
        if not listed.exists():
            made = subprocess.run(
                [sys.executable, "-m", "attnmt", "shortlist", str(model)], capture_output=True, text=True
            )
            if made.returncode:
                sys.exit(f"attnmt shortlist {model} failed:\n{made.stderr[-2000:]}")
        name = model.name
        for beam in beams:
            found += [
                Engine(f"{name} fp32", str(model), beam),
                Engine(f"{name} int8", str(model), beam, True),
                Engine(f"{name} int8+shortlist", str(model), beam, True, str(listed)),
            ]
            if k == 0:
                found += [
                    Engine(f"{name} CTranslate2 {q}", str(folder), beam) for q, folder in exports.items()
                ]
    return found


def export(model: Path, tmp: Path) -> dict[str, Path]:
    folders = {}
    for quantization in ("float32", "int8"):
        folder = tmp / f"ct2_{quantization}"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "attnmt",
                "export",
                str(model),
                str(folder),
                "--quantization",
                quantization,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(f"attnmt export {model} failed:\n{done.stderr[-2000:]}")
        folders[quantization] = folder
    return folders


def child(spec: str, source: Path, reference: Path, threads: int, limit: int | None) -> None:
    """One timed pass of one engine (in its own process): prints ``PASS {json}``."""
    import gzip

    import sacrebleu
    import torch

    from attnmt.cli.common import open_translator
    from attnmt.decoding.translator import DecodeOverrides

    torch.set_num_threads(threads)
    engine = Engine(**json.loads(spec))
    with (
        gzip.open(source, "rt", encoding="utf-8") as src,
        gzip.open(reference, "rt", encoding="utf-8") as ref,
    ):
        lines, refs = src.read().splitlines()[:limit], ref.read().splitlines()[:limit]
    translator, _, _ = open_translator(
        Path(engine.model),
        "cpu",
        DecodeOverrides(beam_size=engine.beam, int8=engine.int8 or None),
        shortlist=Path(engine.shortlist) if engine.shortlist else None,
    )
    translator.translate(lines[:64])
    start = time.perf_counter()
    out = translator.translate(lines)
    seconds = time.perf_counter() - start
    hyps = [t.outputs[0][0] if t.outputs else "" for t in out]
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    print(
        "PASS "
        + json.dumps(
            {
                **asdict(engine),
                "seconds": seconds,
                "sents_per_s": len(lines) / seconds,
                "bleu": round(bleu, 2),
            }
        ),
        flush=True,
    )


def picture(
    models: list[Path],
    data: Path,
    beams: list[int],
    rounds: int,
    threads: int,
    limit: int | None,
    figure: Path | None,
    script: Path,
) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="attnmt-picture-") as tmp:
        rows = engines(models, beams, export(models[0], Path(tmp)))
        per_round = []
        for r in range(rounds):
            found = {}
            for engine in rows if r % 2 == 0 else rows[::-1]:
                out = subprocess.run(
                    [
                        sys.executable,
                        str(script),
                        "--picture-child",
                        json.dumps(asdict(engine)),
                        "--data",
                        str(data),
                        "--threads",
                        str(threads),
                        *(["--limit", str(limit)] if limit else []),
                    ],
                    capture_output=True,
                    text=True,
                )
                passes = [line[5:] for line in out.stdout.splitlines() if line.startswith("PASS ")]
                if out.returncode or not passes:
                    sys.exit(f"{engine.label} beam {engine.beam} failed:\n{out.stderr[-2000:]}")
                found[engine] = json.loads(passes[0])
            per_round.append(found)
            print(
                f"round {r + 1}/{rounds}: "
                + ", ".join(f"{e.label} b{e.beam} {found[e]['sents_per_s']:.1f}" for e in rows),
                flush=True,
            )
    table = []
    for engine in rows:
        rates = [found[engine]["sents_per_s"] for found in per_round]
        table.append(
            {
                **asdict(engine),
                "sents_per_s": round(statistics.median(rates), 1),
                "rounds_sents_per_s": [round(x, 1) for x in rates],
                "bleu": per_round[0][engine]["bleu"],
            }
        )
    report(table, models[0].name)
    if figure is not None:
        draw(table, figure)
    return table


def report(table: list[dict], teacher: str) -> None:
    print(f"\n| engine | beam | sentences/s | x {teacher} fp32 | BLEU |")
    print("| --- | --- | --- | --- | --- |")
    for row in table:
        base = next(r for r in table if r["label"] == f"{teacher} fp32" and r["beam"] == row["beam"])
        print(
            f"| {row['label']} | {row['beam']} | {row['sents_per_s']} | "
            f"{row['sents_per_s'] / base['sents_per_s']:.2f} | {row['bleu']} |"
        )
        print("RESULT " + json.dumps(row), flush=True)
    for beam in sorted({r["beam"] for r in table}):
        at = {r["label"]: r for r in table if r["beam"] == beam}
        ours, theirs = at.get(f"{teacher} int8"), at.get(f"{teacher} CTranslate2 int8")
        if ours and theirs:
            rounds = [
                round(a / b, 2) for a, b in zip(ours["rounds_sents_per_s"], theirs["rounds_sents_per_s"])
            ]
            print(
                f"beam {beam}: attnmt int8 / CTranslate2 int8 = {statistics.median(rounds):.2f} (median of "
                f"the rounds' ratios {rounds})"
            )


def draw(table: list[dict], path: Path) -> None:
    """One colour per engine (model and way of decoding), circles greedy and squares beam 5, a legend
    rather than labels on the points (which overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    labels = list(dict.fromkeys(row["label"] for row in table))
    colours = plt.get_cmap("tab10")
    markers = {1: "o", 5: "s"}
    for k, label in enumerate(labels):
        rows = sorted((r for r in table if r["label"] == label), key=lambda r: r["beam"])
        ax.plot([r["sents_per_s"] for r in rows], [r["bleu"] for r in rows], color=colours(k % 10), lw=0.8,
                alpha=0.5)
        for row in rows:
            ax.scatter(row["sents_per_s"], row["bleu"], color=colours(k % 10),
                       marker=markers.get(row["beam"], "^"), s=40, label=label if row is rows[0] else None)
    ax.set_xscale("log")
    ax.set_xlabel("sentences/s on test2016 (2 threads; log scale)")
    ax.set_ylabel("BLEU (sacrebleu)")
    ax.set_title("BLEU against speed: circles greedy, squares beam 5")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    print(f"wrote {path}", flush=True)

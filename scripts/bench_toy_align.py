"""Alignment error rate on the toy task's 300 test sentences: the toy Transformer recipe unguided and with
guided alignment training, each read the ways ``attnmt align`` offers, with the gold alignments the toy
task generates. The recipes train one after the other (a minute each on 2 cores), then every reading is
scored through the command line, as a user runs it.

    python scripts/bench_toy_align.py --out runs/bench_toy_align

Trains ``configs/toy_transformer.yaml`` (unguided), ``configs/toy_transformer_guided.yaml`` (guided) and,
for ``--reverse``, the unguided recipe in the other direction (German to English, the same toy pairs
written out by ``attnmt toy-data``), unless the run folders under ``--out`` already hold a finished run.
Prints a markdown table and writes ``--out/toy_align.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ATTNMT = [sys.executable, "-m", "attnmt"]


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*ATTNMT, *map(str, args)], check=True, cwd=REPO, capture_output=True, text=True,
                          **kwargs)


def train(config: Path, run_dir: Path) -> float:
    """Train unless finished already; the minutes it took (0 when reused)."""
    if (run_dir / "checkpoints" / "best.pt").exists() or list(run_dir.glob("checkpoints/step_*.pt")):
        return 0.0
    started = time.perf_counter()
    run("train", config, "--run-dir", run_dir)
    return (time.perf_counter() - started) / 60


def reverse_config(out: Path, data: Path) -> Path:
    """The toy Transformer recipe from German to English, on the toy pairs as files."""
    cfg = yaml.safe_load((REPO / "configs" / "toy_transformer.yaml").read_text(encoding="utf-8"))
    cfg["data"] = {"src_lang": "de", "tgt_lang": "en", "max_len": cfg["data"]["max_len"],
                   "train": {"src": str(data / "train.de"), "tgt": str(data / "train.en")},
                   "dev": {"src": str(data / "dev.de"), "tgt": str(data / "dev.en")}}
    cfg["train"].pop("run_dir", None)
    path = out / "toy_transformer_de_en.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def score(model: Path, data: Path, *options) -> dict:
    started = time.perf_counter()
    result = run("align", model, "--src", data / "test.en", "--tgt", data / "test.de",
                 "--gold", data / "test.align", "--json", *options)
    return {**json.loads(result.stdout), "seconds": round(time.perf_counter() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_toy_align")
    parser.add_argument("--no-reverse", action="store_true", help="skip the German-to-English model")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "toy"
    if not (data / "test.align").exists():
        # The same generator and seed as the recipes' toy splits: train 10,000, dev 300, test 300.
        run("toy-data", data, "--train-size", 10000, "--dev-size", 300, "--test-size", 300)
    plain, guided, reverse = out / "unguided", out / "guided", out / "reverse_de_en"
    minutes = {"unguided": train(REPO / "configs" / "toy_transformer.yaml", plain),
               "guided": train(REPO / "configs" / "toy_transformer_guided.yaml", guided)}
    if not args.no_reverse:
        minutes["reverse"] = train(reverse_config(out, data), reverse)

    readings = [
        ("unguided", plain, "default (every layer and head, mutual argmax)", []),
        ("unguided", plain, "every layer and head, argmax", ["--method", "argmax"]),
        ("unguided", plain, "last layer, mutual", ["--layer", "last"]),
        ("unguided", plain, "last layer, argmax (attnmt's old default)", ["--layer", "last", "--method", "argmax"]),
        ("unguided", plain, "layer 1, mutual", ["--layer", "1"]),
        ("unguided", plain, "Shift-Att rows, every layer, mutual", ["--shift"]),
        ("unguided", plain, "Shift-Att rows, every layer, argmax", ["--shift", "--method", "argmax"]),
        ("guided", guided, "default (the taught layer 1, head 1, mutual)", []),
        ("guided", guided, "taught head, argmax", ["--method", "argmax"]),
        ("guided", guided, "every layer and head, mutual", ["--layer", "avg", "--heads", "all"]),
    ]
    if not args.no_reverse:
        for method in ("intersection", "grow-diag", "grow-diag-final-and", "union"):
            readings.append(("unguided", plain, f"with the de-en model, argmax each way, {method}",
                             ["--reverse", reverse, "--method", "argmax", "--symmetrize", method]))
    rows = []
    for recipe, model, what, options in readings:
        found = score(model, data, *options)
        rows.append({"recipe": recipe, "reading": what, "options": " ".join(map(str, options)), **found})
        print(f"{recipe:9s} {what:58s} AER {100 * found['aer']:5.2f}%", flush=True)
    bleu = {name: json.loads(run("eval", model, "--src", data / "test.en", "--ref", data / "test.de",
                                 "--json").stdout)
            for name, model in (("unguided", plain), ("guided", guided))}
    print("\n| recipe | reading | AER | precision | recall |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['recipe']} | {r['reading']} | {100 * r['aer']:.2f}% | {100 * r['precision']:.1f}% "
              f"| {100 * r['recall']:.1f}% |")
    for name, scores in bleu.items():
        print(f"{name}: test BLEU {scores.get('bleu', scores)}")
    print(f"training minutes: {minutes}")
    (out / "toy_align.json").write_text(json.dumps({"rows": rows, "bleu": bleu, "minutes": minutes}, indent=1),
                                        encoding="utf-8")


if __name__ == "__main__":
    main()

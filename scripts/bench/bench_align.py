"""Word alignments on Multi30k de-en: attnmt's cross-attention beside eflomal's, agreement and speed, in one
run.

    python scripts/bench/bench_align.py --model /work/runs_bench/m30k_de_en \\
        --reverse /work/runs_bench/m30k_en_de

Multi30k has no gold alignments, so eflomal (Östling & Tiedemann 2016, an unsupervised Bayesian HMM with
fertility, the usual strong statistical aligner) stands in for the reference: its links, the two directions
symmetrized with grow-diag-final-and, are the sure links against which every attnmt alignment of the split
gets precision, recall, F1 and AER (``attnmt.insight.links.alignment_scores``; AER with only sure links is
1 - F1). Each one's F1 against eflomal's forward-only and intersection alignments is beside it.

eflomal learns from a corpus, so it aligns the first ``--eflomal-train`` training pairs (default all
29,000) and the split together, both directions in one call (its defaults: model 3, 3 samplers, iterations
scaled to the corpus size; its sampler seeds from the clock, so its links vary a little from run to run),
and the split's lines are kept. Its two directions are symmetrized with attnmt's ``symmetrize``, the same
heuristic ``attnmt align --reverse`` uses. Words on both sides are what ``attnmt align`` reads: the
space-separated tokens of each cleaned line (``attnmt.data.words.segment``), punctuation attached as Multi30k
writes it; eflomal lowercases its copy for its statistics, which leaves the word indices alone.

attnmt: ``attnmt align MODEL --src SPLIT.de.gz --tgt SPLIT.en.gz --output FILE`` as a subprocess, one
after the other, with its defaults (every layer and head averaged, mutual argmax), ``--method argmax``,
``--shift``, and each ``--layer`` alone; with ``--reverse`` each again aligned both ways and symmetrized
with grow-diag-final-and. Times are wall seconds of the whole command, so they include starting Python,
importing torch and loading the model(s); ``start-up s`` is the same command on the split's first pair
only, and ``net sent/s`` the split's sentences over the time beyond it. eflomal's time covers preparing
its input, both directions on the whole corpus and the symmetrization: ``split sent/s`` is the split's
sentences over it, ``all sent/s`` every pair it aligned. After one untimed warm-up command (Python, torch
and the model files into the page cache), ``--runs`` (3) rounds each time every aligner once, in the
order of the table, and each time is the median over rounds, so a slow spell of a shared machine falls on
all of them; eflomal's links are those of the last round (the files in ``--out``), and its other rounds'
F1 against them shows how much its seeds alone move it. ``--threads`` (2) OpenMP/torch threads for both.
Each attnmt row also gets its F1 by the source and by the target word: by the word's pieces under the
model's tokenizer (1, 2, 3 or more: a long German compound is cut into several) and for words with an
apostrophe inside (French elisions such as l'homme).

Reproduce: the extra (``pip install -e '.[align]'``, i.e. ``pip install eflomal==2.0.0``: an sdist that
compiles C with gcc and OpenMP, ``-march=native``), then the two models, 15 minutes each, one after the
other (the en-de config is a copy of ``configs/multi30k_de_en_transformer.yaml`` with src_lang/tgt_lang
and the de/en file names swapped)::

    attnmt train configs/multi30k_de_en_transformer.yaml --run-dir /work/runs_bench/m30k_de_en \\
        --set train.max_minutes=15
    attnmt train /work/runs_bench/multi30k_en_de_transformer.yaml --run-dir /work/runs_bench/m30k_en_de \\
        --set train.max_minutes=15

``--smoke`` is CI's smoke run (``tests/scripts/test_scripts_smoke.py``), its numbers meaningless: no warm-up
command, the first configuration only (and its twin aligned both ways with ``--reverse``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO
from eflomal_align import align_words, corpus_words, read_links, symmetrized, write_links
from scriptargs import InputFolder, Model, Number, OutputFolder, ScriptParser, guarded, require_module

from attnmt.errors import DataError

DATA = REPO.parent / "shared" / "data" / "multi30k"
ATTNMT = [sys.executable, "-m", "attnmt"]
HEURISTIC = "grow-diag-final-and"


def eflomal(train: tuple[list, list], split: tuple[list, list], out: Path) -> tuple[float, float, dict]:
    """One eflomal run on train + split, both directions, its files written to ``out``: (seconds in all,
    seconds of eflomal's own call, the split's links by name: forward, reverse, intersection,
    grow-diag-final-and)."""
    started = time.perf_counter()
    found = align_words(train[0] + split[0], train[1] + split[1], out)
    aligned = time.perf_counter() - started
    skip = len(train[0])
    links = {name: value[skip:] for name, value in found.items()}  # both (source, target)
    links[HEURISTIC] = symmetrized(links, HEURISTIC)
    seconds = time.perf_counter() - started
    links["intersection"] = [f & r for f, r in zip(links["forward"], links["reverse"])]
    for name, value in links.items():
        write_links(out / f"eflomal.{name}.txt", value)
    return seconds, aligned, links


def attnmt_align(model: Path, reverse: Path | None, flags: list[str], src: Path, tgt: Path, output: Path,
                 device: str) -> tuple[list[str], float]:
    """One ``attnmt align`` subprocess (in the repository, the paths made absolute): (its command, its wall
    seconds)."""
    command = [*ATTNMT, "align", str(model.resolve()), "--src", str(src.resolve()), "--tgt",
               str(tgt.resolve()), "--output", str(output.resolve()), "--device", device, *flags]
    if reverse is not None:
        command += ["--reverse", str(reverse.resolve()), "--symmetrize", HEURISTIC]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return command, seconds


def agreement(predicted: list, references: dict) -> dict:
    """Precision, recall, F1 and AER against eflomal's grow-diag-final-and links as sure links, and F1
    against its forward and intersection links."""
    from attnmt.insight.links import alignment_scores

    scores = {}
    for name in (HEURISTIC, "forward", "intersection"):
        s = alignment_scores(predicted, references[name], references[name])
        f1 = 2 * s.precision * s.recall / (s.precision + s.recall) if s.precision + s.recall else 0.0
        scores[name] = {"precision": round(s.precision, 4), "recall": round(s.recall, 4), "f1": round(f1, 4),
                        "aer": round(s.aer, 4), "predicted": s.predicted, "reference": s.sure}
    return scores


BUCKETS = ("1 piece", "2 pieces", "3+ pieces", "with an apostrophe")


def word_buckets(words: list[list[str]], encode) -> list[list[tuple[str, ...]]]:
    """Per line, per word, the buckets it falls in: by its pieces under the model's tokenizer (a German
    compound is usually 3+) and whether an apostrophe sits inside it (a French elision: l'homme)."""
    flat = [w for line in words for w in line]
    pieces = iter(encode(flat) if flat else [])
    out = []
    for line in words:
        out.append([])
        for word in line:
            n = len(next(pieces))
            buckets = (BUCKETS[min(n, 3) - 1],) if n else ()
            out[-1].append(buckets + ((BUCKETS[3],) if re.search(r"\w['’]\w", word) else ()))
    return out


def by_buckets(predicted: list, reference: list, buckets: list, side: int) -> dict:
    """Precision, recall and F1 against ``reference`` of the links whose word on ``side`` (0 source, 1
    target) is in each bucket."""
    found = {b: [0, 0, 0] for b in BUCKETS}  # predicted, reference, both
    for pred, ref, line in zip(predicted, reference, buckets):
        for k, links in enumerate((pred, ref)):
            for link in links:
                for b in line[link[side]] if link[side] < len(line) else ():
                    found[b][k] += 1
                    found[b][2] += k == 0 and link in ref
    scores = {}
    for b, (n_pred, n_ref, both) in found.items():
        p, r = both / n_pred if n_pred else 0.0, both / n_ref if n_ref else 0.0
        scores[b] = {"precision": round(p, 4), "recall": round(r, 4), "reference": n_ref,
                     "f1": round(2 * p * r / (p + r), 4) if p + r else 0.0}
    return scores


def variants(layers: list[int], with_reverse: bool) -> list[tuple[str, list[str], bool]]:
    """(name, ``attnmt align`` flags, aligned both ways) of each configuration, in the order they run."""
    one_way = [("avg, mutual", []), ("avg, argmax", ["--method", "argmax"]),
               ("avg, mutual, shift", ["--shift"])]
    one_way += [(f"layer {n}, mutual", ["--layer", str(n)]) for n in layers]
    runs = [(name, flags, False) for name, flags in one_way]
    if with_reverse:
        runs += [(f"{name} + reverse, {HEURISTIC}", flags, True) for name, flags in one_way]
    return runs


def slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--model", type=Model(), required=True, help="a de-en run folder or checkpoint")
    ap.add_argument("--reverse", type=Model(), help="an en-de run folder or checkpoint: also align both ways")
    ap.add_argument("--data", type=InputFolder(), default=DATA,
                    help="the Multi30k folder (default: %(default)s)")
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--src-lang", default="de")
    ap.add_argument("--tgt-lang", default="en")
    ap.add_argument("--eflomal-train", type=Number(int, low=0), default=29000,
                    help="training pairs eflomal also aligns for its statistics (default: all 29,000)")
    ap.add_argument("--layers", type=Number(int, low=1), nargs="*", default=[1, 2, 3],
                    help="cross-attention layers to try alone (1-based)")
    ap.add_argument("--out", type=OutputFolder(), default=REPO / "runs" / "bench_align",
                    help="folder for the alignment files and bench_align.json (default: %(default)s)")
    ap.add_argument("--runs", type=Number(int, low=1), default=3,
                    help="rounds; each times every aligner once")
    ap.add_argument("--threads", type=Number(int, low=1), default=2,
                    help="OpenMP/torch threads of eflomal and attnmt")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                    help="attnmt align's --device")
    ap.add_argument("--smoke", action="store_true",
                    help="CI's smoke run (its numbers mean nothing): no warm-up command, the first "
                    "configuration only (and its twin aligned both ways with --reverse)")
    ap.checks.append(check_data)
    return ap


def corpus_file(args, split: str, lang: str) -> Path:
    return args.data / f"{split}.{lang}.gz"


def check_data(args) -> None:
    """The split's and the training corpus's two sides are in --data."""
    for split in (args.split, "train"):
        for lang in (args.src_lang, args.tgt_lang):
            if not corpus_file(args, split, lang).is_file():
                raise DataError(f"--data {args.data}: no {corpus_file(args, split, lang).name} in it")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    require_module("eflomal", "bench_align needs eflomal: pip install -e '.[align]'")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # eflomal's binary and the attnmt subprocesses
    args.out.mkdir(parents=True, exist_ok=True)

    src, tgt = corpus_file(args, args.split, args.src_lang), corpus_file(args, args.split, args.tgt_lang)
    split = (corpus_words(src), corpus_words(tgt))
    train = (corpus_words(corpus_file(args, "train", args.src_lang), args.eflomal_train),
             corpus_words(corpus_file(args, "train", args.tgt_lang), args.eflomal_train))
    if len(split[0]) != len(split[1]) or len(train[0]) != len(train[1]):
        raise DataError(f"{args.src_lang} and {args.tgt_lang} sides differ in length under {args.data}")
    n = len(split[0])
    print(f"{args.split}: {n} pairs; eflomal also sees {len(train[0])} training pairs", flush=True)

    first = args.out / f"first.{args.src_lang}", args.out / f"first.{args.tgt_lang}"
    for path, words in zip(first, (split[0][0], split[1][0])):
        path.write_text(" ".join(words) + "\n", encoding="utf-8")
    directions = [False, True] if args.reverse else [False]
    runs = variants(args.layers, args.reverse is not None)
    if args.smoke:
        runs = runs[:1] + [run for run in runs if run[2]][:1]
    outputs = {name: args.out / f"attnmt.{slug(name)}.txt" for name, _, _ in runs}
    commands: dict[str, list[str]] = {}
    seconds: dict[str, list[float]] = {}  # per configuration, one time per round

    def timed(key: str, value: float) -> None:
        seconds.setdefault(key, []).append(value)

    # Untimed: Python, torch and the model files into the page cache, so round 1 is not the cold one.
    if not args.smoke:
        attnmt_align(args.model, None, [], *first, args.out / "first.links", args.device)
    eflomal_rounds = []
    for r in range(args.runs):
        total, aligned, links = eflomal(train, split, args.out)
        timed("eflomal", total)
        timed("eflomal align", aligned)
        eflomal_rounds.append(links)
        for both in directions:  # the fixed cost: the same command on one pair
            timed(f"start-up {both}", attnmt_align(args.model, args.reverse if both else None, [], *first,
                                                   args.out / "first.links", args.device)[1])
        for name, flags, both in runs:
            commands[name], took = attnmt_align(args.model, args.reverse if both else None, flags, src, tgt,
                                                outputs[name], args.device)
            timed(name, took)
        print(f"round {r + 1}/{args.runs}: eflomal {total:.1f} s, "
              + ", ".join(f"{name} {seconds[name][-1]:.1f} s" for name, _, _ in runs), flush=True)

    def median(key: str) -> float:
        return statistics.median(seconds[key])

    references = eflomal_rounds[-1]  # the round whose files are in --out
    # eflomal's sampler seeds from the clock: how far its other rounds are from the reference
    self_f1 = [agreement(links[HEURISTIC], references)[HEURISTIC]["f1"] for links in eflomal_rounds[:-1]]
    took, n_all = median("eflomal"), len(train[0]) + n
    rows = [{"aligner": f"eflomal, {HEURISTIC} (reference)", "seconds": round(took, 2),
             "rounds_s": [round(x, 2) for x in seconds["eflomal"]],
             "align_seconds": round(median("eflomal align"), 2), "startup_seconds": None, "sentences": n,
             "sents_per_s": round(n / took, 1), "all_sentences": n_all,
             "all_sents_per_s": round(n_all / took, 1),
             "file": str(args.out / f"eflomal.{HEURISTIC}.txt"),
             "agreement": agreement(references[HEURISTIC], references), "self_f1_other_rounds": self_f1}]
    from attnmt.data.tokenizer import load_tokenizer

    # The model's pieces: its run folder's tokenizer (a checkpoint lies in RUN/checkpoints/).
    tokenizer = load_tokenizer((args.model if args.model.is_dir() else args.model.parents[1]) / "tokenizer")
    buckets = (word_buckets(split[0], tokenizer.encode_src), word_buckets(split[1], tokenizer.encode_tgt))
    for name, _, both in runs:
        predicted = read_links(outputs[name])
        if len(predicted) != n:
            sys.exit(f"{outputs[name]}: {len(predicted)} lines, expected {n}")
        took, overhead = median(name), median(f"start-up {both}")
        rows.append({"aligner": f"attnmt {name}", "seconds": round(took, 2),
                     "rounds_s": [round(x, 2) for x in seconds[name]], "startup_seconds": round(overhead, 2),
                     "sentences": n, "sents_per_s": round(n / took, 1),
                     "net_sents_per_s": round(n / (took - overhead), 1) if took > overhead else None,
                     "command": commands[name], "file": str(outputs[name]),
                     "agreement": agreement(predicted, references),
                     **{f"by_{side}_word": by_buckets(predicted, references[HEURISTIC], buckets[k], k)
                        for k, side in enumerate(("source", "target"))}})

    results = {"split": args.split, "pairs": n, "eflomal_train": len(train[0]), "threads": args.threads,
               "runs": args.runs, "device": args.device, "model": str(args.model),
               "reverse": str(args.reverse) if args.reverse else None, "reference": f"eflomal {HEURISTIC}",
               "startup_rounds_s": {("both" if both else "forward"): seconds[f"start-up {both}"]
                                    for both in directions}, "rows": rows}
    (args.out / "bench_align.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")

    best = max(rows[1:], key=lambda r: r["agreement"][HEURISTIC]["f1"])
    print(f"\n{args.split} {args.src_lang}-{args.tgt_lang}, {n} pairs; reference: eflomal {HEURISTIC} "
          f"(trained on {len(train[0])} + {n} pairs); {args.threads} threads; times: median of {args.runs} "
          "rounds\n")
    print("| aligner | time s | start-up s | split sent/s | net sent/s | all sent/s | P | R | F1 | AER "
          "| F1 vs eflomal fwd | F1 vs eflomal ∩ |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a = r["agreement"]
        ref = a[HEURISTIC]
        mark = " **(best)**" if r is best else ""
        print(f"| {r['aligner']}{mark} | {r['seconds']:.1f} | {fmt(r['startup_seconds'])} "
              f"| {r['sents_per_s']:.1f} "
              f"| {fmt(r.get('net_sents_per_s'))} | {fmt(r.get('all_sents_per_s'))} | {ref['precision']:.3f} "
              f"| {ref['recall']:.3f} | {ref['f1']:.3f} | {ref['aer']:.3f} | {a['forward']['f1']:.3f} "
              f"| {a['intersection']['f1']:.3f} |")
    for side in ("source", "target"):
        print(f"\nF1 against eflomal by the {side} word (pieces under the model's tokenizer; an apostrophe "
              "inside: an elision), links in the reference:\n")
        print("| aligner | " + " | ".join(BUCKETS) + " |\n|---|" + "---:|" * len(BUCKETS))
        for r in (rows[1], best) if best is not rows[1] else (best,):
            cells = r[f"by_{side}_word"]
            print(f"| {r['aligner']} | " + " | ".join(f"{cells[b]['f1']:.3f} ({cells[b]['reference']})"
                                                   for b in BUCKETS) + " |")
    if self_f1:
        print("\neflomal's other rounds (other seeds) against the reference: F1 "
              + ", ".join(f"{x:.3f}" for x in self_f1))
    print(f"\nwrote {args.out / 'bench_align.json'}")


if __name__ == "__main__":
    main()

"""Why the taught head does not say what it was taught: guided alignment on Multi30k de-en, the head held
against its teacher's links over steps, on the training pairs and the test split, each choice varied in turn.

    python scripts/bench/bench_guided.py --out runs/bench_guided --steps 500

The teacher is eflomal (``scripts/eflomal_align.py``'s aligner, both directions symmetrised with
grow-diag-final-and) on the training corpus and the test split together; its links of the training corpus
are what the guided runs learn, its links of the test split what they are held to. Agreement is F1 against
those links taken as sure (``alignment_scores``; with sure links only, AER is 1 - F1).

Stages, each skipped where its result is already in ``--out`` (run it again to go on after a stop):

1. ``teacher``: ``OUT/teacher.train.align`` and ``OUT/teacher.test.align`` (de word i, en word j);
2. ``train``: one run per variant (``OUT/runs/NAME``), ``--steps`` steps each (``train.max_steps``, no
   minute cap, so the runs compare at equal steps however busy the machine is), a checkpoint every
   ``--every`` steps kept, one validation at the end (dev BLEU, the recipe's beam):
   ``unguided`` (the de-en recipe), ``causal`` (the guided recipe: layer 2, head 1, weight 0.05),
   ``causal_w1`` (weight 1.0), ``full`` (weight 0.05, ``train.alignment.full_context``), ``full_w03`` and
   ``full_w1`` (full context, weights 0.3 and 1.0), and
   ``reverse`` (``full_w1`` from English to German, the teacher's links turned round);
3. ``measure``: per run and kept checkpoint, F1 of ``align``'s default reading against the teacher on
   the first ``--train-pairs`` training pairs and on the test split; for each run's last checkpoint, the
   readings varied in turn (each layer; each head of the taught layer; the taught head; its layer's heads
   averaged; the pieces merged into words or linked when any piece is; mutual, argmax, threshold; the
   full-context pass or the causal one), and ``full_w1`` symmetrised with ``reverse``
   (grow-diag-final-and); and the ceiling of each extraction: the teacher's own links as attention
   (each target word's row spread evenly over its linked source words) read back by it.

Everything lands in ``OUT/results.json``; ``--report`` prints it as Markdown tables. ``--smoke`` is CI's
smoke run, its numbers meaningless: the toy task as files in ``--data`` stands in for Multi30k, the
recipes' smallest model, attnmt's commands in this process (``benchlib.in_process``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import IN_PROCESS, REPO, in_process, run_here, smoke_settings
from eflomal_align import corpus_words
from scriptargs import InputFolder, Number, OutputFolder, ScriptParser, guarded, require_module

DATA = REPO.parent / "shared" / "data" / "multi30k"
ATTNMT = [sys.executable, "-m", "attnmt"]
UNGUIDED, GUIDED = REPO / "configs" / "multi30k_de_en_transformer.yaml", \
    REPO / "configs" / "multi30k_de_en_transformer_guided.yaml"
VARIANTS = {  # name -> (guided?, overrides, reversed?)
    "unguided": (False, [], False),
    "causal": (True, [], False),
    "causal_w1": (True, ["train.alignment.weight=1.0"], False),
    "full": (True, ["train.alignment.full_context=true"], False),
    "full_w03": (True, ["train.alignment.full_context=true", "train.alignment.weight=0.3"], False),
    "full_w1": (True, ["train.alignment.full_context=true", "train.alignment.weight=1.0"], False),
    "reverse": (True, ["train.alignment.full_context=true", "train.alignment.weight=1.0"], True),
}
EXTRACTIONS = ("mutual", "argmax", "threshold")


def files(data: Path, smoke: bool) -> dict[str, tuple[Path, Path]]:
    """split -> (de, en) files: Multi30k's, or with ``--smoke`` the toy task's (en, de) in their place."""
    if smoke:
        return {split: (data / f"{split}.en", data / f"{split}.de") for split in ("train", "dev", "test")}
    names = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
    return {split: (data / f"{name}.de.gz", data / f"{name}.en.gz") for split, name in names.items()}


def teacher(out: Path, pairs: dict[str, tuple[Path, Path]]) -> dict[str, list[set]]:
    """eflomal's links of the training corpus and the test split, aligned together (written once, then
    read back)."""
    from eflomal_align import align_words, read_links, symmetrized, write_links

    paths = {split: out / f"teacher.{split}.align" for split in ("train", "test")}
    if not all(p.exists() for p in paths.values()):
        words = {split: (corpus_words(pairs[split][0]), corpus_words(pairs[split][1])) for split in paths}
        started = time.perf_counter()
        work = out / "eflomal"
        work.mkdir(parents=True, exist_ok=True)
        found = symmetrized(align_words(words["train"][0] + words["test"][0],
                                        words["train"][1] + words["test"][1], work), "grow-diag-final-and")
        n = len(words["train"][0])
        write_links(paths["train"], found[:n])
        write_links(paths["test"], found[n:])
        seconds = time.perf_counter() - started
        print(f"teacher: eflomal on {len(found):,} pairs in {seconds:.0f} s", flush=True)
    return {split: read_links(path) for split, path in paths.items()}


def turned(path: Path, out: Path) -> Path:
    """The Pharaoh file ``path`` with every link turned round (source and target swapped), at ``out``."""
    from eflomal_align import read_links, write_links

    if not out.exists():
        write_links(out, [{(j, i) for i, j in links} for links in read_links(path)])
    return out


def train(args, name: str, pairs: dict[str, tuple[Path, Path]]) -> None:
    """One variant's run, unless its last checkpoint is there."""
    run = args.out / "runs" / name
    if (run / "checkpoints" / f"step_{args.steps:08d}.pt").exists() or (run / "done.json").exists():
        return
    guided, overrides, backwards = VARIANTS[name]
    sides = {split: (p[::-1] if backwards else p) for split, p in pairs.items()}
    sets = [f"data.{split}.{side}={path.resolve()}" for split, (src, tgt) in sides.items()
            for side, path in (("src", src), ("tgt", tgt))]
    if backwards:
        sets += ["data.src_lang=en", "data.tgt_lang=de"]
    if guided:
        links = args.out / "teacher.train.align"
        if backwards:
            links = turned(links, args.out / "teacher.train.rev.align")
        # The taught head (the recipe ships the alignment layer): what this benchmark measures.
        sets += [f"train.alignment.path={links.resolve()}", "train.alignment.module=head",
                 "train.alignment.shift=false"]
    keep = args.steps // args.every + 1
    sets += [f"train.max_steps={args.steps}", "train.max_minutes=0", f"train.save_every={args.every}",
             f"train.keep_last={keep}", "train.average_last=0", f"train.eval_every={args.steps}", *overrides]
    if args.smoke:
        sets += [f"{k}={v}" for k, v in smoke_settings("transformer").items()
                 if k not in ("train.max_steps", "train.save_every", "train.eval_every")]
    config = GUIDED if guided else UNGUIDED
    command = [*ATTNMT, "train", str(config), "--run-dir", str(run.resolve()),
               *[x for s in sets for x in ("--set", s)]]
    print(f"train: {name} ({args.steps} steps)", flush=True)
    started = time.perf_counter()
    if IN_PROCESS["on"]:  # --smoke: in this process (a child's start-up would cost more than its steps)
        code, _ = run_here(command[3:], keep=False)
        if code != 0:
            sys.exit(f"{name}: attnmt train failed with exit code {code}")
    else:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{name}: attnmt train failed:\n{done.stderr[-3000:]}")
    (run / "done.json").write_text(json.dumps({"seconds": round(time.perf_counter() - started, 1)}) + "\n")


def dev_bleu(run: Path) -> float | None:
    """The run's last validated dev BLEU (``metrics.jsonl``)."""
    scores = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    bleu = [s["bleu"] for s in scores if s.get("bleu") is not None]
    return bleu[-1] if bleu else None


# ------------------------------------------------------------------------------------------ measuring


def f1(predicted: list, reference: list) -> float:
    """F1 of ``predicted`` links against ``reference`` links taken as sure, over the whole split."""
    from attnmt.insight.links import alignment_scores

    s = alignment_scores(predicted, reference, reference)
    return round(2 * s.precision * s.recall / (s.precision + s.recall), 4) if s.precision + s.recall else 0.0


class Pairs:
    """Sentence pairs as one checkpoint reads them: its pieces and words, and its cross-attention (one
    (H, T, S) array per layer per pair) of the causal pass or the full-context one, computed once."""

    def __init__(self, checkpoint: Path, sources: list[str], targets: list[str]):
        from attnmt.cli.common import open_for_attention
        from attnmt.insight.reading import default_align_options, word_pieces

        self.translator, self.cfg, _ = open_for_attention(checkpoint, "cpu", None)
        self.default = default_align_options(self.cfg)
        self.src_ids, self.src_groups, self.tgt_ids, self.tgt_groups = word_pieces(
            self.translator, sources, targets, None)
        self.maps: dict[bool, list] = {}

    def cross(self, full_context: bool) -> list:
        from attnmt.insight.attention_maps import teacher_forced_attention

        if full_context not in self.maps:
            t = self.translator
            found = teacher_forced_attention(t.model, self.src_ids, self.tgt_ids, t.device,
                                             t.decode.max_tokens, ["cross"], full_context=full_context)
            self.maps[full_context] = [m["cross"] for m in found]
        return self.maps[full_context]

    def links(self, **changes) -> list:
        """Every pair's word links under the model's default reading with ``changes`` (``AlignOptions``
        fields)."""
        import dataclasses

        from attnmt.insight.reading import read_links

        options = dataclasses.replace(self.default, **changes)
        cross = self.cross(options.full_context)
        return [read_links(c, s, t, options) for c, s, t in zip(cross, self.src_groups, self.tgt_groups)]


def readings(pairs: Pairs) -> dict[str, dict]:
    """The readings varied in turn, as (label -> ``AlignOptions`` changes)."""
    d = pairs.default
    n_layers, n_heads = pairs.cfg.model.dec_layers, pairs.cfg.model.n_heads
    out = {"default": {}}
    out |= {f"layer {k + 1}, all heads": {"layer": k, "heads": None} for k in range(n_layers)}
    out["every layer and head"] = {"layer": None, "heads": None}
    if d.layer is not None:
        out |= {f"layer {d.layer + 1}, head {h + 1}": {"heads": (h,)} for h in range(n_heads)}
    out["words: any piece"] = {"words": "any"}
    out |= {f"extraction: {m}": {"method": m} for m in EXTRACTIONS}
    out[f"{'causal' if d.full_context else 'full-context'} pass"] = {"full_context": not d.full_context}
    return out


def ceilings(reference: list[set], src_words: list[int], tgt_words: list[int]) -> dict[str, float]:
    """Each extraction's F1 when the attention is the teacher's own links (each target word's row spread
    evenly over its linked source words; a word without links spread over every source word)."""
    import numpy as np

    from attnmt.insight.links import extract_alignment

    found = {}
    for method in EXTRACTIONS:
        predicted = []
        for links, S, T in zip(reference, src_words, tgt_words):
            matrix = np.zeros((T, S))
            for i, j in links:
                matrix[j, i] = 1.0
            empty = matrix.sum(1) == 0
            matrix[empty] = 1.0
            matrix /= matrix.sum(1, keepdims=True)
            predicted.append(extract_alignment(matrix, method, 0.3) if S and T else [])
        found[method] = f1(predicted, reference)
    return found


def lines(path: Path, limit: int | None = None) -> list[str]:
    from attnmt.data.readers import read_lines

    out = []
    for line in read_lines(path):
        if limit is not None and len(out) == limit:
            break
        out.append(line)
    return out


def measure_run(args, name: str, pairs: dict, reference: dict[str, list]) -> dict:
    """F1 against the teacher over the run's kept checkpoints (train sample and test), and the readings of
    its last checkpoint varied in turn (test)."""
    run = args.out / "runs" / name
    backwards = VARIANTS[name][2]
    n = args.train_pairs
    texts = {"train": [lines(p, n) for p in pairs["train"]], "test": [lines(p) for p in pairs["test"]]}
    if backwards:
        texts = {split: value[::-1] for split, value in texts.items()}
        reference = {split: [{(j, i) for i, j in x} for x in links] for split, links in reference.items()}
    reference = {"train": reference["train"][:n], "test": reference["test"]}
    checkpoints = sorted((run / "checkpoints").glob("step_*.pt"))
    found: dict = {"dev_bleu": dev_bleu(run), "steps": {}, "minutes": None}
    if (run / "done.json").exists():
        found["minutes"] = round(json.loads((run / "done.json").read_text())["seconds"] / 60, 1)
    for checkpoint in checkpoints:
        step = int(checkpoint.stem.split("_")[1])
        scores = {}
        for split in ("train", "test"):
            read = Pairs(checkpoint, *texts[split])
            scores[split] = f1(read.links(), reference[split])
        found["steps"][str(step)] = scores  # as results.json keeps it
        print(f"measure: {name} step {step}: {scores}", flush=True)
    last = read  # the last checkpoint on the test split, its attention already computed
    found["readings"] = {label: f1(last.links(**changes), reference["test"])
                         for label, changes in readings(last).items()}
    if not backwards:
        found["test_links"] = last.links()
    else:
        found["test_links"] = [sorted((j, i) for i, j in x) for x in last.links()]
    return found


def measure(args, pairs: dict, reference: dict) -> dict:
    from attnmt.insight.links import symmetrize

    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"runs": {}}
    for name in args.variants:
        run = args.out / "runs" / name
        if not (run / "done.json").exists() or name in results["runs"]:
            continue
        results["runs"][name] = measure_run(args, name, pairs, reference)
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    runs = results["runs"]
    test = reference["test"]
    if "full_w1" in runs and "reverse" in runs:
        links = {name: [[tuple(link) for link in pair] for pair in runs[name]["test_links"]]
                 for name in ("full_w1", "reverse")}  # JSON gives lists
        both = [sorted(symmetrize(f, r, "grow-diag-final-and"))
                for f, r in zip(links["full_w1"], links["reverse"])]
        results["symmetrised"] = {"full_w1 + reverse": f1(both, test), "full_w1": f1(links["full_w1"], test),
                                  "reverse": f1(links["reverse"], test)}
    words = [(len(corpus_words_line(s)), len(corpus_words_line(t)))
             for s, t in zip(lines(pairs["test"][0]), lines(pairs["test"][1]))]
    results["ceilings"] = ceilings(test, [w[0] for w in words], [w[1] for w in words])
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def corpus_words_line(line: str) -> list[str]:
    from attnmt.data.words import segment

    return [w.text for w in segment(line)]


def report(results: dict) -> str:
    """``results.json`` as Markdown tables."""
    runs = results.get("runs", {})
    out = ["| run | dev BLEU | minutes | " + " | ".join(f"step {s}" for s in _steps(runs)) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in _steps(runs)) + " |"]
    for name, found in runs.items():
        cells = [f"{found['steps'][s]['train']:.3f} / {found['steps'][s]['test']:.3f}"
                 if s in found["steps"] else "" for s in _steps(runs)]
        out.append(f"| {name} | {found['dev_bleu']} | {found['minutes']} | " + " | ".join(cells) + " |")
    out += ["", "F1 against the teacher: training pairs / test split, by step.", ""]
    labels = list(dict.fromkeys(label for found in runs.values() for label in found["readings"]))
    out += ["| reading (test) | " + " | ".join(runs) + " |", "| --- |" + " --- |" * len(runs)]
    for label in labels:
        cells = (str(f.get("readings", {}).get(label, "")) for f in runs.values())
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    if "symmetrised" in results:
        out += ["", "| symmetrised (test) | F1 |", "| --- | --- |"]
        out += [f"| {k} | {v} |" for k, v in results["symmetrised"].items()]
    out += ["", "| extraction ceiling (the teacher's links as attention) | F1 |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in results.get("ceilings", {}).items()]
    return "\n".join(out)


def _steps(runs: dict) -> list[str]:
    return sorted({s for found in runs.values() for s in found["steps"]}, key=int)


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--out", type=OutputFolder(), default=REPO / "runs" / "bench_guided",
                    help="the teacher's links, the runs and results.json (default runs/bench_guided)")
    ap.add_argument("--data", type=InputFolder(), default=DATA, help="Multi30k's folder (default ../shared)")
    ap.add_argument("--steps", type=Number(int, above=0), default=500, help="steps of each run")
    ap.add_argument("--every", type=Number(int, above=0), default=100, help="a checkpoint kept every N steps")
    ap.add_argument("--train-pairs", type=Number(int, above=0), default=300,
                    help="training pairs held to the teacher per checkpoint")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--report", action="store_true", help="print results.json as tables and stop")
    ap.add_argument("--smoke", action="store_true", help="CI's smoke run: the toy task in --data")
    return ap


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.report:
        print(report(json.loads((args.out / "results.json").read_text())))
        return
    require_module("eflomal", "the teacher is eflomal: pip install -e '.[align]'")
    in_process(args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = files(args.data, args.smoke)
    reference = teacher(args.out, pairs)
    for name in args.variants:
        train(args, name, pairs)
    print(report(measure(args, pairs, reference)))


if __name__ == "__main__":
    main()

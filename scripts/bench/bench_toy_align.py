"""Alignment error rate on the toy task's 300 test sentences: the toy Transformer recipe unguided and with
guided alignment training, each read the ways ``attnmt align`` offers, with the gold alignments the toy
task generates. The recipes train one after the other (a minute each on 2 cores), then every reading is
scored through the command line, as a user runs it.

    python scripts/bench/bench_toy_align.py --out runs/bench_toy_align

Trains ``configs/toy_transformer.yaml`` (unguided), ``configs/toy_transformer_guided.yaml`` (guided) and,
unless ``--no-reverse``, the unguided recipe in the other direction (German to English, the same toy pairs
written out by ``attnmt toy-data``), unless the run folders under ``--out`` already hold a finished run.
Prints a markdown table and writes ``--out/toy_align.json``. ``--smoke`` is CI's smoke run
(``tests/scripts/test_scripts_smoke.py``), its numbers meaningless: 200/20/20 toy pairs, the recipes' smallest
model (with their two decoder layers) for a few steps, one reading of each model, attnmt's commands in this
process instead of a child each (``benchlib.in_process``).

With ``--sources`` it also measures where the alignments of a real corpus (one without gold) could come from
for guided training: the guided recipe is trained again on the toy training pairs aligned (a) by the
unguided attnmt model itself (``attnmt align``'s default), (b) by it symmetrized with the de-en model
(grow-diag-final-and), and (c) by eflomal (the optional extra ``attnmt[align]``; both directions,
symmetrized with the same grow-diag-final-and), instead of the toy's gold. eflomal's own test AER (it
aligns the training and test pairs together, unsupervised) is the dedicated aligner's baseline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import IN_PROCESS, REPO, in_process, run_here, smoke_settings
from eflomal_align import align_words, corpus_words, symmetrized, write_links
from scriptargs import OutputFolder, ScriptParser, guarded, require_module

from attnmt.errors import ConfigError

ATTNMT = [sys.executable, "-m", "attnmt"]


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    """``attnmt ARGS`` in a child (``--smoke``, ``benchlib.in_process``: in this process), its stdout kept; a
    failure raises ``CalledProcessError``."""
    command = [*ATTNMT, *map(str, args)]
    if not IN_PROCESS["on"]:
        return subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True, **kwargs)
    code, stdout = run_here(command[3:], keep=True)
    if code != 0:
        raise subprocess.CalledProcessError(code, command, stdout)
    return subprocess.CompletedProcess(command, code, stdout)


SIZES = {"train": 10000, "dev": 300, "test": 300}  # the recipes' toy splits
SMOKE_SIZES = {"train": 200, "dev": 20, "test": 20}


def smoke_sets(toy: bool) -> list[str]:
    """``--smoke``'s overrides of a recipe: its smallest model with the recipe's two decoder layers (the
    guided recipe teaches layer 2), a few steps and, on the toy task itself (``toy``), small splits."""
    settings = {**smoke_settings("transformer"), "model.enc_layers": 2, "model.dec_layers": 2}
    if toy:
        settings.update({f"data.{split}.size": size for split, size in SMOKE_SIZES.items()})
    return [word for key, value in settings.items() for word in ("--set", f"{key}={value}")]


def train(config: Path, run_dir: Path, *sets: str) -> float:
    """Train unless finished already; the minutes it took (0 when reused)."""
    if (run_dir / "checkpoints" / "best.pt").exists() or list(run_dir.glob("checkpoints/step_*.pt")):
        return 0.0
    started = time.perf_counter()
    run("train", config, "--run-dir", run_dir, *sets)
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


def eflomal_align(src: Path, tgt: Path, out: Path) -> tuple[list[set], float]:
    """eflomal's links of every line of src/tgt (both directions, grow-diag-final-and) and its seconds."""
    started = time.perf_counter()
    links = symmetrized(align_words(corpus_words(src), corpus_words(tgt), out.parent), "grow-diag-final-and")
    seconds = time.perf_counter() - started
    write_links(out, links)
    return links, seconds


def sources(out: Path, data: Path, plain: Path, reverse: Path | None) -> list[dict]:
    """Guided training on alignments from attnmt itself and from eflomal instead of the gold."""
    from attnmt.insight.links import alignment_scores, parse_pharaoh, read_gold

    made: dict[str, Path] = {}
    own = out / "train.own.align"
    if not own.exists():
        run("align", plain, "--src", data / "train.en", "--tgt", data / "train.de", "--output", own)
    made["attnmt (unguided model, mutual)"] = own
    if reverse is not None:
        both = out / "train.own_gdfa.align"
        if not both.exists():
            run("align", plain, "--src", data / "train.en", "--tgt", data / "train.de", "--output", both,
                "--reverse", reverse, "--method", "argmax", "--symmetrize", "grow-diag-final-and")
        made["attnmt with the de-en model, gdfa"] = both
    # eflomal sees the training and the test pairs together; its training lines go to guided training.
    joint_src, joint_tgt = out / "joint.en", out / "joint.de"
    train_lines = (data / "train.en").read_text(encoding="utf-8").splitlines()
    joint_src.write_text((data / "train.en").read_text() + (data / "test.en").read_text(), encoding="utf-8")
    joint_tgt.write_text((data / "train.de").read_text() + (data / "test.de").read_text(), encoding="utf-8")
    links, seconds = eflomal_align(joint_src, joint_tgt, out / "joint.eflomal.align")
    efl = out / "train.eflomal.align"
    efl.write_text("".join(line + "\n" for line in (out / "joint.eflomal.align").read_text().splitlines()
                           [: len(train_lines)]), encoding="utf-8")
    made["eflomal, gdfa"] = efl
    test = links[len(train_lines):]
    gold = read_gold(data / "test.align", len(test), data / "test.en")
    eflomal_test = alignment_scores(test, gold.sure, gold.possible)
    gold_train = read_gold(data / "train.align", len(train_lines), data / "train.en")
    rows = [{"source": "eflomal itself on the test pairs", "test_aer": eflomal_test.aer,
             "seconds": round(seconds, 1), "sentences": len(links)}]
    for name, path in made.items():
        lines = [parse_pharaoh(line)[0] for line in path.read_text(encoding="utf-8").splitlines()]
        train_aer = alignment_scores(lines, gold_train.sure, gold_train.possible).aer
        run_dir = out / ("guided_" + "".join(c if c.isalnum() else "_" for c in name))
        if not list(run_dir.glob("checkpoints/step_*.pt")):
            run("train", REPO / "configs" / "toy_transformer_guided.yaml", "--run-dir", run_dir,
                "--set", f"train.alignment.path={path}")
        found = score(run_dir, data)
        rows.append({"source": name, "train_aer": train_aer, "test_aer": found["aer"]})
        print(f"guided on {name}: its training alignments' AER {100 * train_aer:.2f}%, "
              f"the guided model's test AER {100 * found['aer']:.2f}%", flush=True)
    return rows


def print_sources(found: list[dict]) -> None:
    if found:
        print("\n| guided on | its train AER | guided test AER |\n| --- | --- | --- |")
        for r in found:
            train_aer = f"{100 * r['train_aer']:.2f}%" if "train_aer" in r else "-"
            print(f"| {r['source']} | {train_aer} | {100 * r['test_aer']:.2f}% |")


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("--out", type=OutputFolder(), default=REPO / "runs" / "bench_toy_align")
    parser.add_argument("--no-reverse", action="store_true", help="skip the German-to-English model")
    parser.add_argument("--sources", action="store_true",
                        help="also train guided on attnmt's and eflomal's alignments (needs attnmt[align])")
    parser.add_argument("--sources-only", action="store_true",
                        help="only the --sources stage, on the runs already in --out")
    parser.add_argument("--smoke", action="store_true",
                        help="CI's smoke run (its numbers mean nothing): 200/20/20 toy pairs, the recipes' "
                        "smallest two-layer model for a few steps, the first reading of each model only, "
                        "attnmt's commands in this process")
    parser.checks.append(check_smoke)
    return parser


def check_smoke(args) -> None:
    if args.smoke and (args.sources or args.sources_only):
        raise ConfigError("--smoke: not with --sources (its trainings are the recipes' own)")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    in_process(args.smoke)
    if args.sources or args.sources_only:
        require_module("eflomal", "--sources: eflomal is not installed: pip install -e '.[align]'")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "toy"
    plain, guided, reverse = out / "unguided", out / "guided", out / "reverse_de_en"
    if args.sources_only:
        found = sources(out, data, plain, None if args.no_reverse else reverse)
        print_sources(found)
        return
    sizes = SMOKE_SIZES if args.smoke else SIZES
    if not (data / "test.align").exists():
        # The same generator and seed as the recipes' toy splits: train 10,000, dev 300, test 300.
        run("toy-data", data, *(word for split in sizes for word in (f"--{split}-size", sizes[split])))
    sets = smoke_sets(toy=True) if args.smoke else []
    minutes = {"unguided": train(REPO / "configs" / "toy_transformer.yaml", plain, *sets),
               "guided": train(REPO / "configs" / "toy_transformer_guided.yaml", guided, *sets)}
    if not args.no_reverse:
        minutes["reverse"] = train(reverse_config(out, data), reverse, *(smoke_sets(toy=False) if args.smoke
                                                                         else []))

    readings = [
        ("unguided", plain, "default (every layer and head, mutual argmax)", []),
        ("unguided", plain, "every layer and head, argmax", ["--method", "argmax"]),
        ("unguided", plain, "pieces linked, words by any piece, mutual", ["--words", "any"]),
        ("unguided", plain, "last layer, mutual", ["--layer", "last"]),
        ("unguided", plain, "last layer, argmax (attnmt's old default)",
         ["--layer", "last", "--method", "argmax"]),
        ("unguided", plain, "layer 1, mutual", ["--layer", "1"]),
        ("unguided", plain, "Shift-Att rows, every layer, mutual", ["--shift"]),
        ("unguided", plain, "Shift-Att rows, every layer, argmax", ["--shift", "--method", "argmax"]),
        ("guided", guided, "default (the taught layer 2, head 1, mutual)", []),
        ("guided", guided, "taught head, argmax", ["--method", "argmax"]),
        ("guided", guided, "every layer and head, mutual", ["--layer", "avg", "--heads", "all"]),
    ]
    if not args.no_reverse:
        for method in ("intersection", "grow-diag", "grow-diag-final-and", "union"):
            readings.append(("unguided", plain, f"with the de-en model, argmax each way, {method}",
                             ["--reverse", reverse, "--method", "argmax", "--symmetrize", method]))
    if args.smoke:  # one reading of each model: the first, and the first with the de-en model
        readings = [readings[0], next(r for r in readings if r[0] == "guided"),
                    *[r for r in readings if "--reverse" in r[3]][:1]]
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
        print(f"{name}: test " + ", ".join(f"{m['metric']} {m['score']}" for m in scores))
    print(f"training minutes: {minutes}")
    found = sources(out, data, plain, None if args.no_reverse else reverse) if args.sources else []
    print_sources(found)
    (out / "toy_align.json").write_text(json.dumps({"rows": rows, "bleu": bleu, "minutes": minutes,
                                                    "sources": found}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()

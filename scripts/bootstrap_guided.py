"""Guided alignment training on a corpus without gold alignments, in one command: train a model, train one
the other way, align the training corpus with both (``attnmt align --reverse``, grow-diag-final-and),
train the guided recipe on those links (``train.alignment.path``), and score both models.

    python scripts/bootstrap_guided.py configs/multi30k_de_en_transformer.yaml \\
        --guided configs/multi30k_de_en_transformer_guided.yaml --out runs/bootstrap_de_en --minutes 15

Steps, each skipped when its result is already in ``--out`` (run it again to go on after a stop):

1. ``OUT/forward``: ``attnmt train CONFIG``;
2. ``OUT/reverse``: the same config with the languages and the sides of every split swapped
   (``OUT/reverse.yaml``, written from the forward run's resolved config; file-pair corpora only);
3. ``OUT/train.align``: ``attnmt align OUT/forward --src TRAIN_SRC --tgt TRAIN_TGT --reverse OUT/reverse``,
   one Pharaoh line per line of the training corpus as read (what ``train.alignment.path`` expects);
   with ``--teacher eflomal``, ``scripts/eflomal_align.py`` writes it instead and step 2 is left out;
4. ``OUT/guided``: ``attnmt train GUIDED --set train.alignment.path=OUT/train.align``;
5. ``OUT/guided_reverse``: the guided recipe the other way round (``OUT/guided_reverse.yaml``, written from
   the guided run's resolved config), taught the same links turned round (``OUT/train.rev.align``); each
   guided run folder then names the other in ``reverse.json``, so that ``attnmt align OUT/guided`` aligns
   both ways and symmetrizes (grow-diag-final-and) unless told ``--one-way``;
6. ``OUT/summary.json``: test BLEU and chrF of the forward, the guided and the reverse guided model
   (``attnmt eval``, the config's test split, else its dev split, the reverse one read the other way), the
   minutes each step took.

``--minutes`` caps each training (``train.max_minutes``), so the whole bootstrap takes a little over four
times that (three times with eflomal as the teacher); ``--set KEY=VALUE`` goes to every training (the
tests use it for a few steps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from scriptargs import ConfigFile, Number, OutputFolder, ScriptParser, guarded, require_module

from attnmt.errors import ConfigError
from attnmt.insight.links import write_reverse

REPO = Path(__file__).resolve().parents[1]
ATTNMT = [sys.executable, "-m", "attnmt"]


def attnmt(*args) -> str:
    """Run an attnmt command; its stdout, or exit with its own error line and code."""
    return run([*ATTNMT, *map(str, args)])


def run(command: list[str]) -> str:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(result.returncode)
    return result.stdout


def run_script(name: str, *args) -> str:
    """Run one of attnmt's scripts (``scripts/NAME``) the way ``attnmt`` runs: its stdout, or exit."""
    return run([sys.executable, str(REPO / "scripts" / name), *map(str, args)])


def trained(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest.json").exists()


def sides(cfg: dict, split: str) -> tuple[Path, Path] | None:
    """A split's (source, target) files in a resolved config (``check_corpora`` has seen that each is a
    file pair); None when the config has no such split."""
    source = cfg["data"].get(split)
    return None if source is None else (Path(source["src"]), Path(source["tgt"]))


def reverse_config(forward_cfg: dict, path: Path, alignment: Path | None = None) -> Path:
    """The forward run's resolved config with its direction swapped, written to ``path``; guided by the
    links in ``alignment`` (the forward run's ``train.alignment`` otherwise kept), else unguided."""
    cfg = json.loads(json.dumps(forward_cfg))
    data = cfg["data"]
    data["src_lang"], data["tgt_lang"] = data["tgt_lang"], data["src_lang"]
    for split in ("train", "dev", "test"):
        if sides(cfg, split) is not None:
            data[split]["src"], data[split]["tgt"] = data[split]["tgt"], data[split]["src"]
    tokenizer = cfg.get("tokenizer", {})
    tokenizer["src_model"], tokenizer["tgt_model"] = tokenizer.get("tgt_model"), tokenizer.get("src_model")
    guided = cfg["train"].get("alignment")
    cfg["train"]["alignment"] = {**guided, "path": str(alignment)} if alignment and guided else None
    cfg["train"].pop("run_dir", None)
    cfg["train"].pop("init_from", None)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def turn_links(path: Path, out: Path) -> Path:
    """The Pharaoh file ``path`` with every link turned round (target word, source word), written to ``out``
    once: the links the reverse guided model learns."""
    from attnmt.data.readers import read_lines
    from attnmt.insight.links import format_pharaoh, parse_pharaoh
    from attnmt.runfiles import atomic_write_text

    if not out.exists():
        turned = (format_pharaoh((j, i) for i, j in parse_pharaoh(line)[0]) for line in read_lines(path))
        atomic_write_text(out, "".join(line + "\n" for line in turned))
    return out


MARKER = "bootstrap_guided.json"  # in --out: the folder is the bootstrap's own


def check_out(args: argparse.Namespace) -> None:
    """``--out`` is new, empty or the bootstrap's with the same teacher: the bootstrap writes and skips steps
    by what it finds there, and would take someone else's files, or one teacher's links for the other's,
    for its own."""
    out, marker = args.out, args.out / MARKER
    if out.is_dir() and any(out.iterdir()) and not marker.exists():
        raise ConfigError(f"--out {out} holds files the bootstrap did not write; give a new or empty folder")
    if marker.exists():
        before = json.loads(marker.read_text(encoding="utf-8")).get("teacher", "attnmt")
        if before != args.teacher:
            raise ConfigError(f"--out {out} was made with --teacher {before}; give another folder for "
                              f"--teacher {args.teacher}")


def claim(out: Path, teacher: str) -> Path:
    """``out``, made the bootstrap's: its marker written first, with the teacher (``check_out`` has
    checked the folder)."""
    out.mkdir(parents=True, exist_ok=True)
    marker = {"made_by": "scripts/bootstrap_guided.py", "teacher": teacher}
    (out / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return out


def check_corpora(args: argparse.Namespace) -> None:
    """Before any training: the config's corpora are file pairs (the bootstrap reverses them, aligns the
    training pair and scores on the test or dev pair), one training corpus, and a test or dev set."""
    from attnmt.config.schema import load_config

    data = load_config(args.config, forward_overrides(args)).data
    if isinstance(data.train, list):
        raise ConfigError(f"{args.config}: data.train: {len(data.train)} corpora; the bootstrap aligns and "
                          "reverses one, given as data.train.src and .tgt files")
    for split in ("train", "dev", "test"):
        source = getattr(data, split)
        if source is not None and source.format != "text":
            raise ConfigError(f"{args.config}: data.{split}: format {source.format} is not a file pair; the "
                              f"bootstrap aligns and reverses corpora given as data.{split}.src and .tgt "
                              "files")
    if data.test is None and data.dev is None:
        raise ConfigError(f"{args.config}: data.test: none, and no data.dev either; the bootstrap scores "
                          "both models on one of them")


def forward_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` and ``--minutes``: the overrides of all three trainings."""
    return args.sets + ([f"train.max_minutes={args.minutes}"] if args.minutes else [])


def guided_overrides(args: argparse.Namespace) -> list[str]:
    return [*forward_overrides(args), f"train.alignment.path={args.out.resolve() / 'train.align'}"]


def scores(run_dir: Path, split: tuple[Path, Path]) -> dict:
    found = json.loads(attnmt("eval", run_dir, "--src", split[0], "--ref", split[1], "--json"))
    return {entry["metric"]: entry["score"] for entry in found if entry["metric"] in ("bleu", "chrf")}


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("config", type=ConfigFile(forward_overrides),
                    help="the unguided recipe (file-pair corpora)")
    ap.add_argument("--guided", type=ConfigFile(guided_overrides), required=True,
                    help="the guided recipe (with train.alignment)")
    ap.add_argument("--out", type=OutputFolder(), required=True,
                    help="folder for the runs, the alignments and the summary")
    ap.add_argument("--minutes", type=Number(float, above=0), default=None,
                    help="train.max_minutes of each training")
    ap.add_argument("--teacher", choices=("attnmt", "eflomal"), default="attnmt",
                    help="who aligns the training corpus: the forward and a reverse model (default), or "
                         "eflomal (scripts/eflomal_align.py; no reverse model is trained)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for all three trainings (repeatable)")
    ap.checks += [check_corpora, check_out]
    return ap


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.teacher == "eflomal":
        require_module("eflomal", "--teacher eflomal needs eflomal: pip install -e '.[align]'")
    out = claim(args.out.resolve(), args.teacher)
    sets = [x for s in forward_overrides(args) for x in ("--set", s)]
    minutes: dict[str, float] = {}

    def step(name: str, done: bool, run, *command) -> None:
        started = time.perf_counter()
        if not done:
            print(f"bootstrap: {name}", flush=True)
            run(*command)
        minutes[name] = round((time.perf_counter() - started) / 60, 2)

    forward, reverse, guided, links = out / "forward", out / "reverse", out / "guided", out / "train.align"
    step("forward", trained(forward), attnmt, "train", args.config.resolve(), "--run-dir", forward, *sets)
    cfg = yaml.safe_load((forward / "config.yaml").read_text(encoding="utf-8"))
    train = sides(cfg, "train")
    if args.teacher == "eflomal":
        step("align", links.exists(), run_script, "eflomal_align.py", "--src", train[0], "--tgt", train[1],
             "-o", links)
    else:
        step("reverse", trained(reverse), attnmt, "train", reverse_config(cfg, out / "reverse.yaml"),
             "--run-dir", reverse, *sets)
        step("align", links.exists(), attnmt, "align", forward, "--src", train[0], "--tgt", train[1],
             "--reverse", reverse, "-o", links)
    step("guided", trained(guided), attnmt, "train", args.guided.resolve(), "--run-dir", guided,
         *[x for s in guided_overrides(args) for x in ("--set", s)])
    back, turned = out / "guided_reverse", turn_links(links, out / "train.rev.align")
    guided_cfg = yaml.safe_load((guided / "config.yaml").read_text(encoding="utf-8"))
    step("guided_reverse", trained(back), attnmt, "train",
         reverse_config(guided_cfg, out / "guided_reverse.yaml", turned), "--run-dir", back, *sets)
    write_reverse(guided, back)
    write_reverse(back, guided)
    test = sides(cfg, "test") or sides(cfg, "dev")
    summary = {"forward": scores(forward, test), "guided": scores(guided, test),
               "guided_reverse": scores(back, test[::-1]), "test": str(test[0]),
               "teacher": args.teacher, "alignments": str(links), "minutes": minutes}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

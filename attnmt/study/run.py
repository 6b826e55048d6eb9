"""``attnmt study``: one model per attention variant, trained on the same data, budget and seed one after the
other, measured, and written up as one report folder (``report.py``).

The variants (``VARIANTS``): the RNN encoder-decoder with each score function of ``attention.SCORES`` it
takes (additive, dot, general), and the Transformer with each attention kernel: softmax written out with one
head (scaled_dot) and with the config's heads (multihead), the fused SDPA kernel, linear, sparse, Linformer
and Performer. A Transformer variant's kernel runs the encoder's self-attention, and the decoder's where it
can run causally (math, sdpa, linear, performer; sparse and linformer leave the decoder on sdpa);
cross-attention is sdpa for all. Every variant takes the config's data, tokenizer, train and decode
sections; its model section is the config's when the architecture is the config's, else one of the same
width (an LSTM from a Transformer: emb_dim = attn_dim = d_model, hidden_size = d_model / 2 per direction;
a Transformer from an LSTM: d_model = emb_dim), with the other keys at their defaults.

The folder (``--out``)::

    study.json           what the study is (its config, resolved, and its budget): a resume must match
    prepared/            the data and tokenizer, prepared once and copied into each run
    configs/NAME.yaml    each variant's config (JSON, which YAML 1.2 reads)
    runs/NAME/           each variant's run folder; logs/NAME.log what its training printed
    results.json         each finished variant, rewritten (atomically) after each one
    growth.json          the kernels' time and memory against length (``growth.py``)
    report.md, report.html, figures/*.png

Each variant trains in a child process (``python -m attnmt train``), so its peak memory is its own (the
child's ``ru_maxrss``, from ``os.wait4``). A variant is finished when it is in ``results.json``: a second
run skips it; an interrupted one resumes its run from its last checkpoint (``attnmt train`` does that).
SIGINT or SIGTERM is passed on to the child, which saves and stops; the study then stops too (130 / 143).
A study killed outright (SIGKILL, the OOM killer) takes its child with it: the child gets SIGTERM, saves and
stops as above, and is killed if it has not within ``children.GRACE_S`` (``children.popen``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..children import popen
from ..config.jsonfile import read_json
from ..config.schema import Config, config_from_dict
from ..errors import AttnmtError, ConfigError, DataError
from ..models.checkpoint import canonical_hash
from ..runfiles import RunDir, atomic_write_text

STUDY_VERSION = 1
SETTING_NAMES = {"config_sha256": "another config", "minutes": "--minutes", "beam_size": "--beam-size"}


@dataclass(frozen=True)
class Variant:
    arch: str  # lstm | transformer
    label: str  # what it is, for the report
    model: dict[str, Any] = field(default_factory=dict)  # over the model section
    kernel: str | None = None  # the kernel `growth.py` measures for it


VARIANTS: dict[str, Variant] = {
    "additive": Variant("lstm", "LSTM, additive score v^T tanh(W q + U k) (Bahdanau et al. 2015)",
                        {"attention": "additive"}),
    "dot": Variant("lstm", "LSTM, dot score q^T k (Luong et al. 2015)", {"attention": "dot"}),
    "general": Variant("lstm", "LSTM, general score q^T W k (Luong et al. 2015)", {"attention": "general"}),
    "scaled_dot": Variant("transformer", "Transformer, one head of softmax(QK^T/sqrt(d))V written out",
                          {"n_heads": 1, "enc_kernel": "math", "dec_kernel": "math"}, "math"),
    "multihead": Variant("transformer", "Transformer, multi-head softmax attention written out",
                         {"enc_kernel": "math", "dec_kernel": "math"}, "math"),
    "sdpa": Variant("transformer", "Transformer, the fused kernel (F.scaled_dot_product_attention)",
                    {"enc_kernel": "sdpa", "dec_kernel": "sdpa"}, "sdpa"),
    "linear": Variant("transformer", "Transformer, linear attention elu+1 (Katharopoulos et al. 2020)",
                      {"enc_kernel": "linear", "dec_kernel": "linear"}, "linear"),
    "sparse": Variant("transformer", "Transformer, sparse local + strided encoder (Child et al. 2019)",
                      {"enc_kernel": "sparse", "dec_kernel": "sdpa"}, "sparse"),
    "linformer": Variant("transformer", "Transformer, Linformer encoder (Wang et al. 2020)",
                         {"enc_kernel": "linformer", "dec_kernel": "sdpa"}, "linformer"),
    "performer": Variant("transformer", "Transformer, Performer FAVOR+ (Choromanski et al. 2021)",
                         {"enc_kernel": "performer", "dec_kernel": "performer"}, "performer"),
}


class StudyInterrupted(Exception):
    """A signal stopped the study (its running variant saved a checkpoint); ``exit_code`` 130 or 143."""

    def __init__(self, signum: int, variant: str) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} while training {variant}; its checkpoint "
                         "is saved and the same command resumes it")
        self.exit_code = 128 + signum


def parse_variants(text: str) -> list[str]:
    """``--variants``: names separated by commas (``all``: every variant), known and without repeats."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        problem = f"unknown variant {unknown[0]!r}" if unknown else "none given"
        raise ConfigError(f"--variants: {problem}; valid: {', '.join(VARIANTS)} (or all)")
    if len(set(names)) != len(names):
        raise ConfigError(f"--variants: {text!r} names a variant twice")
    return names


def model_section(base: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """The variant's model section from the config's (``base``, as JSON): the same when the architecture
    is the same, else one of the same width; then the variant's own keys."""
    if base["arch"] == variant.arch:
        section = dict(base)
    elif variant.arch == "lstm":
        width = base["d_model"]
        section = {"arch": "lstm", "emb_dim": width, "hidden_size": max(1, width // 2), "attn_dim": width,
                   "dropout": base["dropout"]}
    else:
        section = {"arch": "transformer", "d_model": base["emb_dim"], "dropout": base["dropout"]}
    section.update(variant.model)
    return section


def variant_config(base: Config, name: str, run_dir: Path, minutes: float) -> tuple[Config, dict]:
    """The variant's config, validated (a ConfigError names the variant), and as JSON."""
    from ..training.runstart import preflight

    data = base.to_dict()
    data["model"] = model_section(data["model"], VARIANTS[name])
    data["train"].update(run_dir=str(run_dir), max_minutes=minutes)
    try:
        cfg = config_from_dict(data, source=f"--variants {name}")
        preflight(cfg)
    except ConfigError as e:
        message = str(e).removeprefix(f"--variants {name}: ")
        raise ConfigError(f"--variants {name}: cannot apply to this config: {message}") from None
    return cfg, data


@dataclass
class Study:
    """A study folder and what it was asked for."""

    root: Path
    base: Config
    variants: list[str]
    minutes: float
    beam_size: int

    def __post_init__(self) -> None:
        # Absolute: a relative train.run_dir in a variant's config would resolve against configs/.
        self.root = Path(os.path.abspath(self.root))

    @property
    def prepared(self) -> RunDir:
        return RunDir(self.root / "prepared")

    def run(self, name: str) -> RunDir:
        return RunDir(self.root / "runs" / name)

    def config_file(self, name: str) -> Path:
        return self.root / "configs" / f"{name}.yaml"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    @property
    def results_file(self) -> Path:
        return self.root / "results.json"

    def settings(self) -> dict[str, Any]:
        resolved = self.base.to_dict()
        resolved["train"].pop("run_dir", None)
        return {"config_sha256": canonical_hash(resolved), "minutes": self.minutes,
                "beam_size": self.beam_size}

    def results(self) -> dict[str, Any]:
        results = read_json(self.results_file, DataError, missing=None) or {"variants": {}}
        if not isinstance(results.get("variants"), dict):
            raise DataError(f"{self.results_file}: variants must be a JSON object; give a new --out")
        return results

    def save_results(self, results: dict[str, Any]) -> None:
        atomic_write_text(self.results_file, json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def open_study(study: Study) -> None:
    """Claim ``--out``: a new or empty folder becomes a study; a study made with the same config and budget
    goes on; anything else is refused before anything is written."""
    marker = study.root / "study.json"
    shown = os.path.abspath(study.root)
    if study.root.exists() and not study.root.is_dir():
        raise ConfigError(f"--out {shown}: is a file; give a new or empty folder for the study")
    if os.path.lexists(marker):
        stored = read_json(marker, DataError)
        ours = study.settings()
        changed = [key for key in ours if stored.get(key) != ours[key]]
        if changed:
            made = [SETTING_NAMES[k] + ("" if k == "config_sha256" else f" {stored.get(k)}") for k in changed]
            raise ConfigError(f"--out {shown}: a study made with {' and '.join(made)}; give a new --out, or "
                              "the same config and options to go on with it")
        return
    if study.root.is_dir() and any(study.root.iterdir()):
        raise ConfigError(f"--out {shown}: not an attnmt study folder and not empty; give a new or empty "
                          "folder")
    study.root.mkdir(parents=True, exist_ok=True)
    stamp = {"attnmt_study": STUDY_VERSION, **study.settings()}
    atomic_write_text(marker, json.dumps(stamp, indent=1) + "\n")


def prepare_once(study: Study, workers: int | None = None) -> None:
    """The data and tokenizer, prepared once into ``prepared/`` (again only if that stopped halfway)."""
    from ..data.prepare import prepare
    from ..runfiles import RunLock
    from ..training.runstart import data_to_prepare

    if study.prepared.root.exists() and not data_to_prepare(study.base, study.prepared):
        return
    with RunLock(study.prepared):
        prepare(study.base, study.prepared, workers)


def describe_data(cfg: Config) -> str:
    """The data in a few words: the languages and where the training pairs come from."""
    from ..data.readers import describe_source

    return f"{cfg.data.src_lang}-{cfg.data.tgt_lang}, {describe_source(cfg.data.train)}"


def machine() -> dict[str, Any]:
    """Where the numbers come from: the CPU's model name, the cores, torch's version, CUDA's device."""
    import platform

    import torch

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    found = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


class Signals:
    """SIGINT and SIGTERM while a variant is set up and trained: recorded, and passed on to its training
    child once there is one (``child``). Installed before the variant's run folder appears, so that a
    signal at any moment stops the study with its own message and exit code, and never leaves a child
    training on its own."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.child: subprocess.Popen | None = None

    def __enter__(self) -> Signals:
        def forward(signum: int, frame: Any) -> None:
            self.received.append(signum)
            if self.child is not None:
                self.child.send_signal(signum)

        self._previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def check(self, name: str) -> None:
        if self.received:
            raise StudyInterrupted(self.received[0], name)


def train_child(config_file: Path, log: Path, name: str, signals: Signals) -> tuple[int, float]:
    """``attnmt train`` on the variant's config in a child process, its output into ``log``: (exit code,
    peak resident memory in MiB). SIGINT and SIGTERM (``signals``) are passed on; the child saves and
    stops, then StudyInterrupted."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # Its own session, so that a terminal's Ctrl-C reaches it only through ``signals``; SIGTERM when
        # this process dies, as the forwarded one, so that it saves what it trained.
        child = popen([sys.executable, "-m", "attnmt", "train", str(config_file)], signal.SIGTERM,
                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        signals.child = child
        if signals.received:  # arrived while the child was being started
            child.send_signal(signals.received[0])
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    signals.check(name)
    return child.returncode, usage.ru_maxrss / 1024


def last_error(log: Path) -> str:
    """The child's last ``error:`` line (else its last line), for the study's own error."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
             if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


def train_variant(study: Study, name: str) -> float:
    """Write the variant's config, copy the prepared data into its run (once), train it; its peak MiB."""
    run = study.run(name)
    _, data = variant_config(study.base, name, run.root, study.minutes)
    config_file = study.config_file(name)
    config_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(config_file, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    with Signals() as signals:
        if not run.root.exists():
            tmp = run.root.with_name(f".{name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(study.prepared.root, tmp, ignore=shutil.ignore_patterns(".lock"))
            os.replace(tmp, run.root)
        signals.check(name)
        code, peak = train_child(config_file, study.log(name), name, signals)
    if code != 0:
        error = AttnmtError(f"--variants {name}: training failed (exit {code}): "
                            f"{last_error(study.log(name)).removeprefix('error: ')} (log: {study.log(name)})")
        error.exit_code = code if 0 < code < 128 else 1
        raise error
    return peak


def run_study(study: Study, growth_lengths: Sequence[int] | None, workers: int | None = None,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every variant not yet in ``results.json`` trained and measured, then the kernels' growth (unless
    ``growth_lengths`` is None), then the report. Returns the results."""
    from .measure import measure_variant, update_growth
    from .report import write_report

    for split in ("dev", "test"):
        if getattr(study.base.data, split) is None:
            raise ConfigError(f"data.{split}: the study scores every variant on the dev and test splits; "
                              "give both in the config")
    for name in study.variants:  # every variant's config checked before anything is trained
        variant_config(study.base, name, study.run(name).root, study.minutes)
    open_study(study)
    prepare_once(study, workers)
    results = study.results()
    results["settings"] = {"data": describe_data(study.base), "minutes": study.minutes,
                           "seed": study.base.train.seed, "beam_size": study.beam_size}
    results["machine"] = machine()
    for name in study.variants:
        if name in results["variants"]:
            say(f"{name}: done before, kept")
            continue
        say(f"{name}: training for {study.minutes:g} minutes ({VARIANTS[name].label})")
        started = time.perf_counter()
        peak = train_variant(study, name)
        record = measure_variant(study, name, VARIANTS[name].label, peak)
        record["wall_s"] = round(time.perf_counter() - started, 1)
        results["variants"][name] = record
        study.save_results(results)
        say(f"{name}: dev BLEU {record['dev']['bleu']:.2f}, test BLEU {record['test']['bleu']:.2f}")
    if growth_lengths is not None:
        kernels = list(dict.fromkeys(VARIANTS[n].kernel for n in study.variants if VARIANTS[n].kernel))
        results["growth"] = update_growth(study.root / "growth.json", kernels, growth_lengths, say)
        study.save_results(results)
    written = write_report(study.root, results, study.variants)
    say(f"wrote {', '.join(str(path) for path in written)}")
    return results

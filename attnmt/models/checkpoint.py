"""Checkpoints: the payload, atomic saves, weights-only loads, pointer files, and a model rebuilt from a
checkpoint alone. The only module that builds or reads a checkpoint's payload.

A checkpoint is a dict of tensors and plain values only, so ``torch.load(weights_only=True)`` always
works and an untrusted file cannot run code:

- ``format`` (int), ``attnmt_version``, ``torch_version``;
- ``model``, ``optimizer``, ``schedule``, ``scaler``: state dicts (``optimizer`` None in an average);
- ``progress``: the trainer's counters (``train.Progress`` as a dict);
- ``fingerprint``: the model config and its hash, the training settings that change what the steps
  compute (``dynamics``), the tokenizer's hashes and sizes, a hash of the training data's lengths;
- ``config``: the resolved config; ``tokenizer``: the sentencepiece model bytes as uint8 tensors, with
  ``tokenizer_meta``. So a checkpoint file alone is enough to translate.

Saving (``docs/RELIABILITY.md``, "Checkpoints"): refuse non-finite weights; write a temporary file in
the same folder, fsync, rename, fsync the folder; then the pointer ``latest.json`` the same way; only
then delete old checkpoints. Any failure leaves the previous checkpoint and pointer as they were.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.torch_version import TorchVersion

from .. import __version__
from ..config.jsonfile import parse_json, read_json, regular_bytes
from ..errors import CheckpointError, ConfigError, DataError, DivergedError, ResourceError, os_error
from ..runfiles import EXPORT_MANIFEST, RunDir, atomic_write_bytes, atomic_write_text, replace_file
from .footprint import ModelSpec

log = logging.getLogger(__name__)

FORMAT = 1
STEP_FILE = re.compile(r"^step_(\d{8})\.pt$")
AVERAGE_FILE = "average.pt"  # train.average_last's average of the newest checkpoints, in RUN/checkpoints


def step_file(step: int) -> str:
    return f"step_{step:08d}.pt"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


# ------------------------------------------------------------------------------------------- saving


def save_checkpoint(run: RunDir, payload: dict[str, Any], step: int,
                    after_tmp_write: Callable[[], None] | None = None) -> dict[str, Any]:
    """Write ``payload`` as ``checkpoints/step_<step>.pt`` and point ``latest.json`` at it; returns the
    pointer. ``after_tmp_write``: called between the write and the rename (a test's fault)."""
    for name, tensor in payload["model"].items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise DivergedError(f"refusing to save non-finite weights ({name}) at step {step}; "
                                "the last checkpoint is kept")
    folder = run.checkpoints
    final = folder / step_file(step)
    tmp = folder / f".{final.name}.tmp-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        if after_tmp_write is not None:
            after_tmp_write()
        replace_file(tmp, final)  # a step saved again keeps the mode the user gave it
        pointer = {"step": step, "file": final.name, "sha256": sha256_file(final), "format": FORMAT}
        atomic_write_text(folder / "latest.json", json.dumps(pointer, indent=2))
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (KeyboardInterrupt, SystemExit, ResourceError)):
            raise
        error = e if isinstance(e, OSError) else e.__context__  # torch.save: a RuntimeError from the OSError
        raise (os_error(final, error, "write checkpoint") if isinstance(error, OSError) else
               ResourceError(f"{final}: cannot write checkpoint: {str(e).splitlines()[0]}")) from None
    return pointer


def read_pointer(run: RunDir, name: str) -> dict[str, Any]:
    """``latest.json`` or ``best.json`` as a dict; {} when missing or not a pointer (``latest_checkpoint``
    writes it again from the step files); a pipe, a device or a folder in its place is refused at once."""
    path = run.checkpoints / f"{name}.json"
    if not path.exists():
        return {}
    data = regular_bytes(path, CheckpointError)
    with contextlib.suppress(CheckpointError):
        return parse_json(data, str(path), CheckpointError)
    return {}


def write_pointer(run: RunDir, name: str, data: dict[str, Any]) -> None:
    atomic_write_text(run.checkpoints / f"{name}.json", json.dumps(data, indent=2))


# ------------------------------------------------------------------------------------------ loading


def load_checkpoint(path: Path, expected_sha256: str | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; any problem is a CheckpointError naming the file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder; expected a checkpoint file")
    if expected_sha256 is not None and sha256_file(path) != expected_sha256:
        raise CheckpointError(f"corrupt checkpoint {path}: sha256 does not match latest.json")
    _check_records(path)
    try:
        # Older checkpoints stored torch_version as a TorchVersion, a harmless str subclass; still read them.
        with torch.serialization.safe_globals([TorchVersion]):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip errors, EOFError, UnpicklingError for a pickled payload, ...
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in cause or "Unsupported global" in cause or "Weights only load failed" in cause:
            cause = "it holds pickled objects, which attnmt never loads"
        raise CheckpointError(f"corrupt or unsafe checkpoint {path}: {cause[:200]}") from None
    if not isinstance(payload, dict) or "format" not in payload or "model" not in payload:
        raise CheckpointError(f"{path}: not an attnmt checkpoint")
    if not isinstance(payload["format"], int) or payload["format"] > FORMAT:
        raise CheckpointError(f"{path}: written by checkpoint format {payload['format']}; "
                              f"this attnmt reads <= {FORMAT}")
    return payload


def _check_records(path: Path) -> None:
    """torch's zip reader does not check the CRC-32 the archive records for each of its files, so a flipped
    bit in a tensor's bytes would load as another weight; zipfile checks them (one more read of the file:
    torch stores its records uncompressed). A file that is no zip archive is left to torch.load."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as e:  # a damaged directory: BadZipFile, NotImplementedError, RuntimeError (its flags)
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"corrupt checkpoint {path}: {cause[:200]}") from None
    if bad is not None:
        raise CheckpointError(f"corrupt checkpoint {path}: {bad!r} fails its CRC-32 check")


def latest_checkpoint(run: RunDir) -> tuple[Path, dict[str, Any]] | None:
    """The newest loadable checkpoint of a run: the one latest.json names, else the newest valid step file."""
    pointer = read_pointer(run, "latest")
    failures: list[str] = []
    if pointer.get("file") and STEP_FILE.match(str(pointer["file"])):
        path = run.checkpoints / pointer["file"]
        try:
            return path, load_checkpoint(path, pointer.get("sha256"))
        except CheckpointError as e:
            failures.append(str(e))
    if not run.checkpoints.is_dir():
        return None
    for path in sorted((p for p in run.checkpoints.iterdir() if STEP_FILE.match(p.name)), reverse=True):
        if path.name == pointer.get("file") and failures:
            continue  # it just failed its check against latest.json
        try:
            payload = load_checkpoint(path)
        except CheckpointError as e:
            failures.append(str(e))
            continue
        # Warned only now: when nothing loads, the error below says it in one line.
        for failure in failures:
            log.warning("%s; using %s instead", failure, path.name)
        write_pointer(run, "latest", {"step": int(payload["progress"]["step"]), "file": path.name,
                                      "sha256": sha256_file(path), "format": FORMAT})
        return path, payload
    if failures:
        # Starting over would overwrite and prune these files; a person decides.
        raise CheckpointError(f"{run.checkpoints}: no loadable checkpoint ({failures[0]}); "
                              "move the folder away to start over")
    return None


def resolve_model_path(model: Path) -> Path:
    """MODEL on the command line: a checkpoint file, or a run folder (its best checkpoint, else its
    latest)."""
    model = Path(model)
    if model.is_file():
        return model
    if not model.exists():
        raise CheckpointError(f"{model}: no such checkpoint or run folder")
    if not model.is_dir():  # a pipe or a device: the checks and torch read a checkpoint more than once
        raise CheckpointError(f"{model}: not a file or a folder (a pipe?); a checkpoint is read from disk")
    if (model / EXPORT_MANIFEST).exists():
        raise CheckpointError(f"{model}: a CTranslate2 export, which translate, eval, score, info and serve "
                              "read; give the checkpoint it was exported from")
    run = RunDir(model)
    for name in ("best", "latest"):
        pointer = read_pointer(run, name)
        if pointer.get("file") and (run.checkpoints / pointer["file"]).is_file():
            return run.checkpoints / pointer["file"]
    found = latest_checkpoint(run)
    if found is None:
        raise CheckpointError(f"{model}: run folder has no checkpoint yet")
    return found[0]


def diff_dicts(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, as ``key: old -> new`` (lists of the same length item by item)."""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        old, new = dict(enumerate(old)), dict(enumerate(new))
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]
    return [line for key in list(old) + [k for k in new if k not in old]
            for line in diff_dicts(old.get(key), new.get(key), f"{prefix}{key}.")]


# --------------------------------------------------------------------------------- training state

# train.* keys that may change when a run resumes: they do not change what the steps compute (precision
# and device change only how: its rounding), or what is saved.
RESUMABLE = {"max_steps", "max_epochs", "max_minutes", "valid_beam_size", "log_every", "eval_every",
             "save_every", "keep_last", "keep_best", "patience", "plot_every", "tensorboard", "run_dir",
             "max_nonfinite", "compile", "device", "init_from", "precision", "gradient_checkpointing",
             "average_last"}

# Keys added since checkpoints first recorded their dynamics, with the value every earlier run had:
# a fingerprint leaves such a key out while it has that value, so those runs still resume.
ADDED_DYNAMICS = {"alignment": None, "plateau_patience": 2, "plateau_factor": 0.5, "tokenizer.sampling": None,
                  "freeze_embeddings": False}
# The same for train.alignment.* keys.
ADDED_ALIGNMENT = {"full_context": False, "module": "head", "objective": "links", "translation": "train",
                   "shift": False, "feed_forward": False, "dropout": 0.0}
# The same for model.* keys: a checkpoint's model fingerprint leaves them out while they have these values.
ADDED_MODEL = {"scale_embeddings": True, "output_bias": False}


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def fingerprint(cfg, world_size: int, tokenizer, data_lengths: Sequence[int]) -> dict[str, Any]:
    """What a checkpoint records to refuse a resume that could not be exact: the model config, the
    training dynamics (``train.*`` but ``RESUMABLE``, ``tokenizer.sampling``, world size), tokenizer, data."""
    sampling = cfg.tokenizer.sampling
    trained = cfg.train.model_dump(mode="json") | {"tokenizer.sampling": sampling and sampling.model_dump()}
    if trained.get("alignment"):
        trained["alignment"] = {k: v for k, v in trained["alignment"].items()
                                if not (k in ADDED_ALIGNMENT and v == ADDED_ALIGNMENT[k])}
    dynamics = {k: v for k, v in trained.items()
                if k not in RESUMABLE and not (k in ADDED_DYNAMICS and v == ADDED_DYNAMICS[k])}
    dynamics["world_size"] = world_size
    model = {k: v for k, v in cfg.model.model_dump(mode="json").items()
             if not (k in ADDED_MODEL and v == ADDED_MODEL[k])}
    return {
        "model": model,
        "model_sha256": canonical_hash(model),
        "dynamics": dynamics,
        "tokenizer": tokenizer.fingerprint(),
        "data_sha256": canonical_hash([len(data_lengths), int(np.sum(data_lengths, dtype=np.int64))]),
    }


def recorded_tokenizer(payload: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tokenizer fingerprint a checkpoint was trained with (None without a checkpoint)."""
    return ((payload or {}).get("fingerprint") or {}).get("tokenizer")


def training_payload(cfg, tokenizer, fingerprint: dict, model, optimizer, schedule, scaler,
                     progress: dict) -> dict[str, Any]:
    """The payload of a training checkpoint (the module docstring lists its keys)."""
    return {
        "format": FORMAT,
        "attnmt_version": __version__,
        "torch_version": str(torch.__version__),  # str(): a TorchVersion is not weights_only-loadable
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "scaler": scaler.state_dict() if scaler else None,
        "progress": progress,
        "fingerprint": fingerprint,
        "config": cfg.to_dict(),
        "tokenizer": {name: bytes_tensor(data) for name, data in tokenizer.files().items()},
        "tokenizer_meta": tokenizer.meta(cfg.tokenizer.model_dump(mode="json")),
    }


def restore_training(path: Path, payload: dict[str, Any], fingerprint: dict, model, optimizer, schedule,
                     scaler) -> dict:
    """Load a checkpoint's training state into the given objects, after checking that the run it came
    from computes what this one would (else the error names what changed); returns its progress."""
    if payload.get("optimizer") is None:
        raise CheckpointError(f"{path}: has no training state (an averaged checkpoint?); "
                              "it can translate, not resume")
    old = payload["fingerprint"]
    if old["model_sha256"] != fingerprint["model_sha256"]:
        changes = diff_dicts(old["model"], fingerprint["model"])
        raise CheckpointError(f"{path}: checkpoint was trained with another model config "
                              f"({'; '.join(changes[:4])})")
    if old["tokenizer"] != fingerprint["tokenizer"]:
        raise CheckpointError(f"{path}: tokenizer does not match checkpoint "
                              f"(expected sha256 {old['tokenizer']['src_sha256'][:12]}…)")
    if old["dynamics"] != fingerprint["dynamics"]:
        changes = diff_dicts(old["dynamics"], fingerprint["dynamics"]) or [
            f"{k}: {old['dynamics'].get(k, '(not set)')!r} -> {fingerprint['dynamics'].get(k, '(not set)')!r}"
            for k in sorted(set(old["dynamics"]) ^ set(fingerprint["dynamics"]))]
        raise ConfigError(f"{path}: cannot resume with changed training settings: {'; '.join(changes[:4])}")
    if old["data_sha256"] != fingerprint["data_sha256"]:
        raise DataError(f"{path}: the training data changed since this checkpoint; "
                        "an exact resume is impossible")
    try:
        model.load_state_dict(payload["model"], strict=True)
        optimizer.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: does not fit the model: {str(e).splitlines()[0][:200]}") from None
    schedule.load_state_dict(payload["schedule"])
    if scaler is not None and payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])
    return payload["progress"]


# --------------------------------------------------------------------------------- for inference


def _load_resolved(model_path: Path, attempts: int = 5) -> tuple[Path, dict[str, Any]]:
    """MODEL's checkpoint and its payload. A run folder that a training run is writing can prune the
    checkpoint its pointer named between reading the pointer and opening the file: then the pointer is read
    again (a checkpoint, once open, stays readable whatever is deleted)."""
    for attempt in range(attempts):
        path = resolve_model_path(model_path)
        try:
            return path, load_checkpoint(path)
        except CheckpointError:
            if attempt + 1 == attempts or not Path(model_path).is_dir() or path.exists():
                raise
    raise AssertionError("unreachable")


def load_model(model_path: Path, device: str | torch.device = "cpu"):
    """A trained model from MODEL (a checkpoint file or a run folder) with nothing else: returns
    (model in eval mode, tokenizer, config, checkpoint path). The tokenizer comes from the checkpoint's
    own bytes, checked against the sha256 it recorded."""
    from ..config.schema import config_from_dict
    from ..data.tokenizer import stored_tokenizer
    from . import build_model
    from .footprint import build_within_memory

    path, payload = _load_resolved(model_path)
    try:
        cfg = config_from_dict(payload.get("config"), source=f"{path} (its config)")
    except ConfigError as e:
        raise CheckpointError(f"{path}: its stored config is not valid for this attnmt: {e}") from None
    fingerprint = payload.get("fingerprint")
    expected = fingerprint.get("tokenizer") if isinstance(fingerprint, dict) else None
    try:
        files = {name: tensor_bytes(t) for name, t in payload["tokenizer"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: checkpoint has no usable tokenizer "
                              f"({type(e).__name__}: {e})") from None
    tokenizer = stored_tokenizer(files, expected, path)
    model = build_within_memory(lambda: build_model(cfg.model, tokenizer.src_vocab_size,
                                                    tokenizer.tgt_vocab_size, train=cfg.train), path, device)
    state = payload["model"]
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointError(f"{path}: its weights are not a mapping of names to tensors")
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: parameter {name} holds non-finite values")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the model its config describes: "
                              f"{str(e).splitlines()[0][:300]}") from None
    return model.to(device).eval(), tokenizer, cfg, path


def model_spec(target: Path, overrides: list[str] | None = None) -> ModelSpec:
    """The spec of a config file, a checkpoint, an export or a run folder, checked to fit in memory."""
    from . import build_model
    from .footprint import fits_in_memory

    spec = _spec(Path(target), overrides)
    fits_in_memory(lambda: build_model(spec.cfg.model, spec.src_vocab_size, spec.tgt_vocab_size,
                                       train=spec.cfg.train), target)
    return spec


def _vocab_sizes(sizes: Any, where: str) -> tuple[int, int]:
    if not isinstance(sizes, dict) or not all(type(sizes.get(n)) is int and sizes[n] > 0
                                              for n in ("src_vocab_size", "tgt_vocab_size")):
        raise CheckpointError(f"{where}.src_vocab_size and tgt_vocab_size must be positive integers")
    return sizes["src_vocab_size"], sizes["tgt_vocab_size"]


def _spec(target: Path, overrides: list[str] | None) -> ModelSpec:
    from ..config.schema import config_from_dict, load_config
    from ..data.tokenizer import load_tokenizer

    if target.is_file() and target.suffix not in (".yaml", ".yml"):
        payload = load_checkpoint(target)
        try:  # as load_model: a stored config this attnmt cannot read is the checkpoint's fault (exit 4)
            cfg = config_from_dict(payload.get("config"), source=f"{target} (its config)")
        except ConfigError as e:
            raise CheckpointError(f"{target}: its stored config is not valid for this attnmt: {e}") from None
        if overrides:  # a bad --set stays a usage error (exit 2)
            cfg = config_from_dict(payload["config"], source=f"{target} (its config)", overrides=overrides)
        fingerprint = payload.get("fingerprint")
        sizes = _vocab_sizes(fingerprint.get("tokenizer") if isinstance(fingerprint, dict) else None,
                             f"{target}: fingerprint.tokenizer")
        return ModelSpec(cfg, *sizes, "the checkpoint's tokenizer")
    if target.is_dir() and os.path.lexists(target / EXPORT_MANIFEST):  # attnmt export's folder
        manifest = read_json(target / EXPORT_MANIFEST, CheckpointError)
        sizes = _vocab_sizes(manifest.get("tokenizer"), f"{target / EXPORT_MANIFEST}: tokenizer")
        cfg = config_from_dict(manifest.get("config"), source=f"{target / EXPORT_MANIFEST} (its config)",
                               overrides=overrides or [])
        return ModelSpec(cfg, *sizes, "the export's tokenizer")
    if target.is_dir():
        run = RunDir(target)
        cfg = load_config(run.config, overrides or [])
        if run.tokenizer.exists():
            tokenizer = load_tokenizer(run.tokenizer)
            return ModelSpec(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, "the run's tokenizer")
        return ModelSpec(cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size, "tokenizer.vocab_size")
    cfg = load_config(target, overrides or [])
    return ModelSpec(cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size, "tokenizer.vocab_size")


def save_payload(payload: dict[str, Any], out: Path) -> None:
    """Write a payload that is not part of a run (e.g. an average) to ``out`` atomically: a temporary file in
    the same folder, fsync, rename; a failure leaves ``out`` as it was."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(out, buffer.getvalue())

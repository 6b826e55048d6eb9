"""What a run settles before its loop (``attnmt/training/runstart.py``): ``train.precision: auto`` picks bf16
on CUDA and on a CPU with native bf16, read from its flags (mocked here), fp32 elsewhere; the choice is
printed and kept in the run folder's train.log."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnmt.training import runstart

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("flags", "chosen"), [
    ({"avx2", "avx512f", "avx512_bf16"}, "bf16"),  # AVX-512 BF16 (this project's AMD EPYC machines)
    ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, "bf16"),  # AMX
    ({"avx2", "avx512f", "fma"}, "fp32"),  # AVX-512 without BF16: emulated
    ({"avx2", "fma"}, "fp32"),  # AVX2 only
    (set(), "fp32"),  # no /proc/cpuinfo
])  # fmt: skip
def test_auto_precision_follows_the_cpu_flags(monkeypatch, flags, chosen):
    monkeypatch.setattr(runstart, "cpu_flags", lambda: set(flags))
    assert runstart.chosen_precision("auto", CPU) == chosen
    assert runstart.autocast_dtype("auto", CPU) == (torch.bfloat16 if chosen == "bf16" else None)
    assert runstart.chosen_precision("auto", CUDA) == "bf16"  # CUDA whatever the CPU
    assert [runstart.chosen_precision(asked, CPU) for asked in ("fp32", "bf16")] == ["fp32", "bf16"]
    emulated = "emulated" in runstart.describe_precision("bf16", CPU)
    assert emulated == (chosen == "fp32")  # bf16 asked for where it is emulated says so
    assert "emulated" not in runstart.describe_precision("auto", CPU)


def test_the_cpu_flags_are_read_from_proc_cpuinfo():
    flags = runstart.cpu_flags()
    if Path("/proc/cpuinfo").is_file():  # Linux, as CI is: a real line of flags
        assert "fpu" in flags and len(flags) > 10
    assert runstart.native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_the_choice_is_printed_and_kept_in_train_log(tiny):
    log = (tiny.reference() / "train.log").read_text(encoding="utf-8")
    assert "training on cpu in fp32 (train.precision fp32)" in log

"""``scripts/docs_figures.py`` end to end on its smoke settings (the smoke run of
``tests/scripts/test_scripts_smoke.py``, ``COVERED``): it trains the smallest demo model, runs a study of
one variant beside it, shoots the explorer, heads and serve pages in headless Chromium, and writes the
eight pictures the docs show. Each opens as a PNG, is under 200 KB and holds no text chunk (no software
version, no date). Then, on the run it reused, the matplotlib pictures come out byte for byte again.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

from helpers import OFFLINE_ENV, REPO

SCRIPT = REPO / "scripts" / "docs_figures.py"
PICTURES = ("cross-attention", "head-grid", "curves", "explorer", "serve", "heads", "study-bleu",
            "study-growth")
DRAWN = ("cross-attention", "head-grid", "curves")  # matplotlib's, from the model alone
LIMIT_S = 300  # a hang guard; the smoke run takes about half a minute


def run_script(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # From another folder than the repository, with relative paths, as a user runs it.
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", *args], cwd=cwd,
                          env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"{done.stdout}\n{done.stderr}"
    return done


def chunks(data: bytes) -> list[str]:
    """The chunk types of a PNG, in order."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    found, at = [], 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        found.append(kind.decode("ascii"))
        at += 12 + length
    return found


def test_docs_figures_smoke(tmp_path):
    from PIL import Image

    done = run_script(tmp_path, "--run", "runs/toy", "--out", "img")
    assert "| picture | KB |" in done.stdout
    written = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert written == sorted(f"{name}.png" for name in PICTURES)
    first = {}
    for name in PICTURES:
        path = tmp_path / "img" / f"{name}.png"
        first[name] = path.read_bytes()
        assert len(first[name]) < 200 * 1024, f"{path.name}: {len(first[name])} bytes"
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 400 and image.height >= 300, path.name
            image.verify()
        # no text (software, date) and no time chunk: only the picture's own
        found = chunks(first[name])
        assert set(found) <= {"IHDR", "PLTE", "tRNS", "IDAT", "IEND"}, (name, found)
    run_script(tmp_path, "--run", "runs/toy", "--out", "again", "--only", *DRAWN)
    for name in DRAWN:
        assert (tmp_path / "again" / f"{name}.png").read_bytes() == first[name], f"{name}.png changed"

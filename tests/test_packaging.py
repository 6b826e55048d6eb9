"""The package as a user installs it: a wheel built from this tree carries the page files that the
explorer, ``heads --html`` and ``attnmt serve`` read with ``importlib.resources``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources

from helpers import REPO


def test_a_built_wheel_carries_every_page_file(tmp_path):
    tree = tmp_path / "tree"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(REPO / "attnmt", tree / "attnmt", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("attnmt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    pages = sorted(p.name for p in (resources.files("attnmt") / "web").iterdir() if p.is_file())
    assert {"explorer.js", "explorer.css", "explorer_body.html", "serve.js", "serve.css",
            "serve_body.html", "heads.js"} <= set(pages)
    missing = [name for name in pages if f"attnmt/web/{name}" not in names]
    assert missing == []

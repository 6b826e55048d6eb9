"""The blocks of docs/getting-started.md that CI runs (a fenced bash block right after a line
``<!-- runnable -->``) run, in order, as a user would: in a scratch folder holding the repository's
``configs/`` (a link), with ``attnmt`` on PATH (this environment's), offline. Every line must exit 0; a
failure shows the block, the line and the tail of its stderr. A line that ends in ``# -> TEXT`` says what it
prints: its output must hold TEXT. Each line's time is printed (``-s``), the costliest first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from helpers import OFFLINE_ENV, REPO

PAGE = REPO / "docs" / "getting-started.md"
MARK = "<!-- runnable -->"
SAYS = re.compile(r"\s#\s*->\s*(.+)$")


def runnable_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number of the block's first line, its commands) of every bash block right after the mark;
    continuation lines joined, comments and blank lines left out."""
    lines, blocks = text.splitlines(), []
    for k, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        start = k + 1
        assert start < len(lines) and re.fullmatch(r"```(bash|sh|shell|console)", lines[start].strip()), \
            f"{PAGE.name}:{k + 1}: {MARK} is not followed by a ```bash block"
        commands, pending = [], ""
        for body in lines[start + 1:]:
            if body.strip().startswith("```"):
                break
            if body.rstrip().endswith("\\"):
                pending += body.rstrip()[:-1].strip() + " "
                continue
            command = (pending + body.strip()).strip()
            pending = ""
            if command and not command.startswith("#"):
                commands.append(command)
        blocks.append((start + 2, commands))
    return blocks


def test_the_page_has_runnable_blocks_and_they_are_read():
    blocks = runnable_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 2 and all(commands for _, commands in blocks)
    sample = f"x\n{MARK}\n```bash\n# a comment\nattnmt a \\\n  b\n\necho c\n```\n"
    assert runnable_blocks(sample) == [(4, ["attnmt a b", "echo c"])]
    assert SAYS.search('attnmt translate RUN "x"  # -> ein satz').group(1) == "ein satz"
    assert any(SAYS.search(c) for _, commands in blocks for c in commands), "no line says what it prints"


def test_the_runnable_blocks_run(tmp_path):
    (tmp_path / "configs").symlink_to(REPO / "configs")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's attnmt first
    env = {**os.environ, **OFFLINE_ENV, "PATH": path}
    times = []
    for first, commands in runnable_blocks(PAGE.read_text(encoding="utf-8")):
        for command in commands:
            started = time.perf_counter()
            done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=600)
            times.append((time.perf_counter() - started, command))
            block = "\n    ".join(commands)
            tail = "\n".join(done.stderr.splitlines()[-15:])
            assert done.returncode == 0, (f"{PAGE.name}, the block at line {first}:\n    {block}\nfailed at: "
                                          f"{command}\nexit {done.returncode}; stderr's tail:\n{tail}")
            said = SAYS.search(command)
            assert not said or said.group(1).strip() in done.stdout, \
                f"{PAGE.name}, the block at line {first}: {command}\nprinted:\n{done.stdout}"
    print(f"\nthe runnable blocks: {sum(t for t, _ in times):.1f} s")
    for seconds, command in sorted(times, reverse=True):
        print(f"{seconds:7.1f} s  {command}")

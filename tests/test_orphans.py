"""Children die with their parent, whatever signal the parent gets (``attnmt/children.py``).

Each kind of child attnmt starts, under a parent started in a session of its own: the parent is signalled
alone (``os.kill(pid, ...)``, not its group, as a service manager or a job scheduler does), and every
descendant it had (found through /proc, children of children) is gone within 5 s: pool workers and the
multiprocessing resource tracker (``attribute --workers 2``), serve's decoder in the middle of a batch
(SIGTERM with no grace: the server leaves by ``os._exit``), a study's training child (SIGKILL: it saves and
exits 143 as on SIGTERM) and torchrun's ranks (SIGKILL to ``python -m attnmt.training.launch``; they
save too).
Then the guard itself, in a parent script: a child spawned from a thread that has ended lives on
(PR_SET_PDEATHSIG would have killed it, as the control child shows), and one that ignores SIGTERM is
killed after the grace.

SIGTERM to a study or to the launcher is passed on to the training children, which the parent waits for:
``test_study.py`` and ``test_torchrun.py`` test those.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers import OFFLINE_ENV, REPO, tiny_study_config, train_args, train_cli

DEADLINE_S = 5.0  # the rule: no child alive this long after its parent was signalled
START_S = 120.0  # how long a parent may take to start its children (2 slow cores, imports of torch)


# ------------------------------------------------------------------------------ processes, from /proc


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in ticks) of ``pid``; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after "pid (comm)", which may hold spaces
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root`` (children, their children...): pid -> start time (which tells a process
    from a later one given the same pid)."""
    table = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, start) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def alive(pid: int, start: int) -> bool:
    """Whether this process (pid and start time) still runs: a zombie has ended (an orphan's zombie waits
    for init, which may be slow to reap it)."""
    stat = _stat(pid)
    return stat is not None and stat[2] == start and stat[1] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_parent(command: list[str], **popen) -> subprocess.Popen:
    """The parent in a session (and process group) of its own, so that nothing but ``os.kill`` of its
    pid reaches it."""
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True, **popen)


def wait_for(condition: Callable[[], bool], parent: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_S
    while not condition():
        assert parent.poll() is None, f"the parent ended (exit {parent.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {START_S:.0f} s"
        time.sleep(0.05)


def children_of(parent: subprocess.Popen, *needles: str) -> dict[int, int]:
    """Once the parent has a descendant whose command line holds each of ``needles`` (as many times as
    given), all its descendants."""
    def found() -> bool:
        lines = [cmdline(pid) for pid in descendants(parent.pid)]
        return all(sum(needle in line for line in lines) >= needles.count(needle) for needle in needles)

    wait_for(found, parent, f"children {needles}")
    return descendants(parent.pid)


def signal_parent_alone(parent: subprocess.Popen, signum: int, children: dict[int, int]) -> None:
    """``signum`` to the parent's pid alone; then wait (up to DEADLINE_S) until none of ``children`` is
    alive; any still alive then are named, and killed."""
    os.kill(parent.pid, signum)
    sent = time.monotonic()
    while time.monotonic() - sent < DEADLINE_S:
        if not any(alive(pid, start) for pid, start in children.items()):
            return
        time.sleep(0.05)
    left = {pid: cmdline(pid) for pid, start in children.items() if alive(pid, start)}
    kill_all(parent, children)
    raise AssertionError(f"alive {DEADLINE_S:g} s after {signal.Signals(signum).name} to the parent: {left}")


def kill_all(parent: subprocess.Popen, children: dict[int, int]) -> None:
    """What a failed test leaves: killed, so that it does not hold the machine's cores."""
    for pid, start in children.items():
        if alive(pid, start):
            os.kill(pid, signal.SIGKILL)
    if parent.poll() is None:
        parent.kill()
    parent.wait(30)


# ------------------------------------------------------------------------------------- shared set-up


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory) -> Path:
    """The tiny Transformer after two steps: untrained, so its translations never end (max_len each),
    which keeps the decoder busy."""
    run = tiny.copy_prepared(tmp_path_factory.mktemp("orphans") / "model")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=2", "train.save_every=2",
                       "train.eval_every=100")
    assert result.returncode == 0, result.stderr
    return run


SENTENCE = "saturday the 4th of april 2004 , monday , 3 june 2001"


# ------------------------------------------------------------------------------ each kind of child


def test_attribute_workers_and_the_resource_tracker_die_with_a_sigterm_parent(model, tmp_path):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text(f"{SENTENCE}\n" * 400, encoding="utf-8")
    tgt.write_text("samstag , 4. april 2004 , montag , 3. juni 2001\n" * 400, encoding="utf-8")
    parent = start_parent([sys.executable, "-m", "attnmt", "attribute", str(model), "--src", str(src),
                           "--tgt", str(tgt), "--workers", "2", "--steps", "256", "-o",
                           str(tmp_path / "out.jsonl")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        children = children_of(parent, "multiprocessing.spawn", "multiprocessing.spawn", "resource_tracker")
        signal_parent_alone(parent, signal.SIGTERM, children)
        assert parent.wait(30) == -signal.SIGTERM
    finally:
        kill_all(parent, {})
    assert not (tmp_path / "out.jsonl").exists()


def test_the_serve_decoder_dies_mid_batch_when_the_server_leaves_by_os_exit(model, tmp_path):
    log = tmp_path / "serve.log"
    with open(log, "w", encoding="utf-8") as stderr:
        parent = start_parent([sys.executable, "-m", "attnmt", "serve", str(model), "--port", "0", "--grace",
                               "0", "--max-sentences", "100000", "--max-batch-tokens", "256"],
                              stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(lambda: log.read_text(encoding="utf-8").startswith("attnmt serve: http://"), parent,
                 "the server's address")
        url = log.read_text(encoding="utf-8").split()[2]
        children = children_of(parent, "multiprocessing.spawn")
        # Two requests of minutes of decoding each for the untrained model: once one waits, the decoder
        # works through the other.
        for _ in range(2):
            threading.Thread(target=_ask, args=(url, [SENTENCE] * 2000), daemon=True).start()
        wait_for(lambda: httpx.get(url + "/health", timeout=10).json()["pending"] > 0, parent,
                 "a request in the decoder and one waiting")
        signal_parent_alone(parent, signal.SIGTERM, children)
        assert parent.wait(30) == 143, log.read_text(encoding="utf-8")
    finally:
        kill_all(parent, {})
    assert "with requests unanswered" in log.read_text(encoding="utf-8")


def _ask(url: str, lines: list[str]) -> None:
    try:
        httpx.post(url + "/translate", json={"text": lines, "beam_size": 4}, timeout=300)
    except httpx.TransportError:
        pass  # the server went away: what this test does to it


def study_config(path: Path) -> Path:
    """test_study's tiny config, training until it is stopped."""
    return tiny_study_config(path, max_steps=100_000, eval_every=100_000, save_every=100_000)


def test_a_studys_training_child_saves_and_stops_when_the_study_is_killed(tmp_path):
    out = tmp_path / "study"
    parent = start_parent([sys.executable, "-m", "attnmt", "study", str(study_config(tmp_path / "tiny.yaml")),
                           "--out", str(out), "--minutes", "5", "--no-growth", "--variants", "sdpa"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "runs" / "sdpa" / "metrics.jsonl"
    try:
        children = children_of(parent, "attnmt train")
        wait_for(lambda: metrics.exists() and '"train"' in metrics.read_text(encoding="utf-8"), parent,
                 "a training step")
        signal_parent_alone(parent, signal.SIGKILL, children)
    finally:
        kill_all(parent, {})
    last = (out / "logs" / "sdpa.log").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert "stopped by SIGTERM at step" in last and last.endswith("checkpoint saved"), last
    assert list((out / "runs" / "sdpa" / "checkpoints").glob("step_*.pt"))


def test_torchruns_ranks_die_with_a_killed_launcher(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    args = train_args(tiny.config["transformer"], run, "train.max_steps=100000", "train.save_every=100000",
                      "train.eval_every=100000")
    parent = start_parent([sys.executable, "-m", "attnmt.training.launch", "--standalone",
                           "--nproc-per-node", "2", "-m", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    try:
        children = children_of(parent, "attnmt train", "attnmt train")
        wait_for(lambda: metrics.exists() and '"train"' in metrics.read_text(encoding="utf-8"), parent,
                 "a training step")
        signal_parent_alone(parent, signal.SIGKILL, children)
    finally:
        kill_all(parent, {})
    assert list((run / "checkpoints").glob("step_*.pt"))  # saved on the SIGTERM (save_every is 100,000)


# ----------------------------------------------------------------------------------- the guard itself

PARENT_SCRIPT = '''
import json, multiprocessing, os, signal, subprocess, sys, threading, time
from attnmt.children import Guard, arm, popen, spawn_context

def echo(conn, guard=None):
    if guard is not None:
        arm(guard)
    while True:
        try:
            conn.send(conn.recv())
        except (EOFError, OSError):
            return

def answers(conn):
    try:
        conn.send("ping")
        return conn.recv() == "ping"
    except (EOFError, OSError):
        return False

def start(context, guard=None):
    mine, theirs = context.Pipe()
    process = context.Process(target=echo, args=(theirs, guard))
    process.start()
    theirs.close()
    assert answers(mine)  # started, and its guard armed
    return process, mine

STUBBORN = """
import signal, sys, time
from attnmt.children import arm_from_env
arm_from_env()
def count(signum, frame):
    with open(sys.argv[1], "a") as log:
        print("SIGTERM", file=log)
signal.signal(signal.SIGTERM, count)
print(1, flush=True)
while True:
    time.sleep(1)
"""

def from_a_thread(make):
    box = []
    thread = threading.Thread(target=lambda: box.append(make()))
    thread.start()
    thread.join()
    while os.path.exists(f"/proc/self/task/{thread.native_id}"):  # its exit done, and any death signal sent
        time.sleep(0.01)
    return box[0]

if __name__ == "__main__":
    guarded = spawn_context()
    main = start(guarded)
    threaded = from_a_thread(lambda: start(guarded))
    # The control: prctl armed in a child spawned from a thread, which the guard does not do.
    naive = from_a_thread(lambda: start(multiprocessing.get_context("spawn"),
                                        Guard(os.getpid(), signal.SIGKILL, True)))
    stubborn = popen([sys.executable, "-c", STUBBORN, sys.argv[1]], signal.SIGTERM, stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # armed, and counting its SIGTERMs
    for _ in range(8):  # threads that die one by one with this process: the kernel re-parents to each
        threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    found = {name: answers(conn) for name, (_, conn) in
             {"main": main, "thread": threaded, "naive": naive}.items()}
    print(json.dumps({"answers": found, "stubborn": stubborn.pid}), flush=True)
    time.sleep(120)
'''


def test_the_guard_spares_a_thread_spawned_child_and_sends_one_sigterm_then_sigkill(tmp_path):
    script, signals = tmp_path / "parent.py", tmp_path / "signals.txt"
    script.write_text(PARENT_SCRIPT, encoding="utf-8")
    parent = start_parent([sys.executable, str(script), str(signals)], stdout=subprocess.PIPE, text=True)
    children: dict[int, int] = {}
    try:
        report = json.loads(parent.stdout.readline())
        # From the main thread, and from a thread that has ended: alive. prctl from that thread: dead.
        assert report["answers"] == {"main": True, "thread": True, "naive": False}
        children = descendants(parent.pid)
        assert report["stubborn"] in children
        # Gone, the stubborn one too: it did not stop on its SIGTERM, and the watchdog's SIGKILL followed.
        signal_parent_alone(parent, signal.SIGKILL, children)
    finally:
        kill_all(parent, children)
    # One SIGTERM, not one per thread of the parent (a second tells `attnmt train` to leave unsaved).
    assert signals.read_text(encoding="utf-8") == "SIGTERM\n"

"""Child processes that die with their parent, whatever ends the parent (SIGTERM, SIGKILL, the OOM killer).

Every process attnmt starts goes through here: ``spawn_context()`` for ``multiprocessing`` children
(``pool.ordered_map``'s workers, serve's decoder), ``popen`` for commands that run attnmt again (a study's
training child, growth's measurements), and ``guard_for`` + ``PARENT_ENV`` where another program spawns
them (torchrun's agent spawning ``launch``'s ranks). A child that is never told its parent died goes on
for ever: a pool worker blocks on a queue whose write end it holds itself, so it never sees end-of-file.

In the child, ``arm`` does, first thing:

1. for SIGKILL, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux, through ctypes: one call does not need a C
   extension), so the kernel kills the child the moment the parent exits, however it exits;
2. then checks that ``getppid()`` is still the parent it was spawned by: a parent that died before the
   prctl went unnoticed by it, and the child is then an orphan already;
3. and, where prctl is not used, a daemon thread that polls ``getppid()`` every ``POLL_S`` (an orphan
   is re-parented, to init or to a subreaper) and then signals its own process.

**Threads.** The kernel fires PR_SET_PDEATHSIG when the *thread* that spawned the child exits, not the
process: a child spawned from a worker thread would be killed when that thread ends, parent alive. So
the parent records whether it spawns from its main thread (the main OS thread lives until the process
exits: Python's shutdown joins the other threads on it), and the child uses prctl only then; spawned
from any other thread it relies on the watchdog alone.

**Which signal.** Pool workers and the decoder hold nothing worth saving: SIGKILL (the decoder ignores
SIGTERM anyway). A training child (a study's, torchrun's ranks) gets SIGTERM, which ``attnmt train``
handles as a user's SIGTERM: it finishes the step, saves a checkpoint and exits 143 (well under a second
on the tests' tiny model). That SIGTERM comes from the watchdog, never from prctl: the kernel sends the
death signal again each time the child is re-parented, and a dying multi-threaded parent can hand it to
its other threads one after another before init takes it; ``attnmt train`` takes a second SIGTERM as
"leave now, unsaved" (torchrun's ranks did, killed with their launcher). The watchdog sends exactly one,
``POLL_S`` at most after the parent died, and SIGKILL ``GRACE_S`` later if the child is still there (a
long step, a slow save: saves are atomic, so a cut one loses nothing but the steps since the last
checkpoint); so every child is gone within ``POLL_S + GRACE_S`` < 5 s of its parent.

**Commands.** The parent passes ``Guard`` in ``PARENT_ENV``; ``python -m attnmt`` and ``python -m
attnmt.study.growth`` call ``arm_from_env`` before anything else, which removes the variable, so that their
own children never inherit a stale guard. The guard holds for a direct child: a ``python -m attnmt`` started
through a wrapper that forks (the given parent still among its ancestors) is left alone.

The resource tracker ``multiprocessing`` starts beside spawned children needs nothing of this: it exits
when the last holder of its pipe (the parent, its workers) is gone (``tests/test_orphans.py`` checks it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess

PARENT_ENV = "ATTNMT_PARENT"
POLL_S = 0.2  # how often the watchdog looks at getppid()
GRACE_S = 4.0  # from a training child's SIGTERM to SIGKILL when it has not exited by then
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Guard:
    """What a child needs to die with its parent: the parent's pid, the signal it is to get, and whether
    prctl may be used for a SIGKILL (the parent spawned it from its main thread)."""

    parent: int
    signal: int
    prctl: bool

    def to_env(self) -> str:
        return f"{self.parent}:{self.signal}:{int(self.prctl)}"

    @classmethod
    def from_env(cls, value: str) -> Guard | None:
        """The guard ``to_env`` wrote, or None for anything else (the variable is ours alone; a value
        this does not read is not a reason to stop a command)."""
        try:
            parent, signum, prctl = (int(part) for part in value.split(":"))
        except ValueError:
            return None
        return cls(parent, signum, bool(prctl)) if parent > 0 and signum > 0 else None


def guard_for(death_signal: int) -> Guard:
    """This process as the parent of a child spawned now, from the current thread."""
    return Guard(os.getpid(), int(death_signal), threading.current_thread() is threading.main_thread())


# ------------------------------------------------------------------------------------- in the child


def arm(guard: Guard) -> None:
    """Die with ``guard.parent``: see the module's docstring. Returns at once."""
    if os.getppid() != guard.parent and _is_ancestor(guard.parent):
        return  # a wrapper between us (torchrun --no-python, a shell): not ours to guard
    if guard.signal == signal.SIGKILL and guard.prctl and _set_parent_death_signal(signal.SIGKILL):
        if os.getppid() != guard.parent:  # after the prctl: a parent that died before it is seen here
            os.kill(os.getpid(), signal.SIGKILL)
        return
    threading.Thread(target=_watch, args=(guard,), name="attnmt-parent-watch", daemon=True).start()


def arm_from_env() -> None:
    """``arm`` the guard a parent put in ``PARENT_ENV``, and remove the variable (our own children get
    their own guard, never this one)."""
    value = os.environ.pop(PARENT_ENV, None)
    guard = Guard.from_env(value) if value else None
    if guard is not None:
        arm(guard)


def _watch(guard: Guard) -> None:
    """Wait for the parent to go (at once if it has gone already); then its signal, once, and after
    ``GRACE_S``, SIGKILL."""
    while os.getppid() == guard.parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), guard.signal)
    if guard.signal != signal.SIGKILL:
        time.sleep(GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)


def _set_parent_death_signal(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, signum); False where there is no such call or it fails."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _is_ancestor(pid: int) -> bool:
    """Whether ``pid`` is among this process's ancestors (from /proc; False where there is none, so that
    an unexpected parent off Linux counts as the parent's death)."""
    current = os.getppid()
    for _ in range(64):
        if current == pid:
            return True
        if current <= 1:
            return False
        try:
            with open(f"/proc/{current}/stat", encoding="ascii", errors="replace") as stat:
                current = int(stat.read().rpartition(")")[2].split()[1])  # after "pid (comm) state"
        except (OSError, ValueError, IndexError):
            return False
    return False


# ------------------------------------------------------------------------------------ in the parent


class GuardedProcess(SpawnProcess):
    """A spawned ``multiprocessing`` process that dies with its parent by SIGKILL: the guard is taken
    in ``start`` (on the spawning thread, which decides whether prctl is safe), travels with the pickled
    process object, and is armed before the target runs."""

    _guard: Guard | None = None

    def start(self) -> None:
        self._guard = guard_for(signal.SIGKILL)
        super().start()

    def run(self) -> None:
        if self._guard is not None:
            arm(self._guard)
        super().run()


class GuardedContext(SpawnContext):
    """The ``spawn`` context, its processes guarded: give it to ``ProcessPoolExecutor(mp_context=...)``
    or make ``Process`` and ``Pipe`` from it."""

    Process = GuardedProcess


_SPAWN = GuardedContext()


def spawn_context() -> GuardedContext:
    """The one multiprocessing context attnmt spawns children with."""
    return _SPAWN


def popen(args: list[str], death_signal: int, env: dict[str, str] | None = None,
          **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, ...)`` of a command that runs attnmt (``python -m attnmt ...``, ``python
    -m attnmt.study.growth ...``), told in ``PARENT_ENV`` to die with this process by ``death_signal``."""
    env = dict(os.environ if env is None else env)
    env[PARENT_ENV] = guard_for(death_signal).to_env()
    return subprocess.Popen(args, env=env, **kwargs)

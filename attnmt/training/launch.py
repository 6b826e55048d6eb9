"""``python -m attnmt.training.launch``: ``torchrun`` with the exit-code contract on signals, and ranks
that die with it.

torchrun forwards SIGTERM or SIGINT to its workers, which save a checkpoint and exit 143 or 130
(``docs/RELIABILITY.md``, "Signals"), but the launcher itself then ends with a traceback and exit 1. This
runs torchrun's own ``main`` with the same arguments and turns that ending into the contract's 128 +
signal, with one line on stderr; anything else torchrun does is unchanged.

torchrun starts each rank in a session of its own, so a launcher killed outright (SIGKILL, the OOM
killer) would leave its ranks training. The ranks inherit ``children.PARENT_ENV`` from here, so that each
``python -m attnmt train`` among them stops as on SIGTERM (a checkpoint at the step boundary, exit 143),
and is killed if it has not within ``children.GRACE_S``, when this process dies.
"""

from __future__ import annotations

import os
import signal
import sys

from ..children import PARENT_ENV, guard_for


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    # Read by each rank's `python -m attnmt` (and removed there): its watchdog sends it one SIGTERM when
    # this process is gone (torchrun's agent runs in it: the ranks are its children).
    os.environ[PARENT_ENV] = guard_for(signal.SIGTERM).to_env()
    try:
        torchrun()
    except SignalException as e:
        sys.stderr.write(f"error: stopped by signal {int(e.sigval)}; the workers saved a checkpoint\n")
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    main()

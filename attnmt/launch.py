"""``python -m attnmt.launch``: ``torchrun`` with the exit-code contract on signals.

torchrun forwards SIGTERM or SIGINT to its workers, which save a checkpoint and exit 143 or 130
(``docs/RELIABILITY.md``, "Signals"), but the launcher itself then ends with a traceback and exit 1. This
runs torchrun's own ``main`` with the same arguments and turns that ending into the contract's 128 +
signal, with one line on stderr; anything else torchrun does is unchanged.
"""

from __future__ import annotations

import sys


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except SignalException as e:
        sys.stderr.write(f"error: stopped by signal {int(e.sigval)}; the workers saved a checkpoint\n")
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    main()

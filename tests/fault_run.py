"""Run the attnmt command line with a fault injected: ``python tests/fault_run.py FAULT ARGS...``.

FAULT is a ``attnmt.training.faults.Faults.parse`` spec (``sigkill_at_step:17``, ``sigkill_after_tmp_write``,
...); it reaches ``attnmt train`` as the Click context object. Only tests run this
(``helpers.train_command``).
"""

import sys

from attnmt.cli import app
from attnmt.training.faults import Faults

if __name__ == "__main__":
    app(sys.argv[2:], prog_name="attnmt", obj=Faults.parse(sys.argv[1]))

from attnmt.children import arm_from_env

arm_from_env()  # before the command line loads: a child of an attnmt process dies with it (children.py)

from attnmt.cli import app  # noqa: E402

app(prog_name="attnmt")

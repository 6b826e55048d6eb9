from attnmt.cli import app

app(prog_name="attnmt")

"""``python -m trainflow`` runs the CLI."""

from trainflow.cli import app

app(prog_name="trainflow")

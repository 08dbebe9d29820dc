"""``python -m trainflow`` runs the CLI."""

from trainflow.cli import main

main()

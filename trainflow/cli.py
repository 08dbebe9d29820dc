"""Placeholder, replaced below."""
import typer

app = typer.Typer()

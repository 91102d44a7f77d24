"""What every command says on a terminal: a clear one-line error, and rich output that fits."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    """Rich console; when output goes to a file or pipe, wide enough not to fold lines."""
    from rich.console import Console  # here, not at start-up: decode's one-line view needs no rich

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 200)


def fail(message: str) -> None:
    """One clear line on stderr, exit status 2."""
    click.echo(f"kafkasniff: {message}", err=True)
    sys.exit(2)

def api_key_named(option: str, text: str) -> int:
    """The key of the API that `text` names or numbers (as `kafkasniff apis` lists them, any case); a CLI error naming
    `option` when Kafka has no such API."""
    from kafkasniff.protocol.schema import apis

    for key, api in apis().items():
        if text.lower() in (api["name"].lower(), str(key)):
            return key
    fail(f"{option}: unknown API {text!r}; `kafkasniff apis` lists the names and keys")

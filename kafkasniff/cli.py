"""The `kafkasniff` command line."""

from __future__ import annotations

import importlib
import json
import sys

import click

from kafkasniff.commands.terminal import api_key_named, fail, make_console
from kafkasniff.protocol.schema import apis, version_range

# Subcommands in modules of their own, imported when run: `decode` starts without what `spark` needs.
LAZY_COMMANDS = {
    "decode": ("kafkasniff.commands.decode", "decode_command"),
    "sniff": ("kafkasniff.commands.sniff", "sniff_command"),
    "groups": ("kafkasniff.commands.insight", "groups_command"),
    "lag": ("kafkasniff.commands.insight", "lag_command"),
    "spark": ("kafkasniff.commands.spark", "spark_command"),
    "report": ("kafkasniff.commands.spark", "report_command"),
}


class LazyGroup(click.Group):
    """A click group whose subcommands in LAZY_COMMANDS are imported only when named or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafkasniff")
def main() -> None:
    """Kafka wire-protocol analyzer: decode captures, sniff live, explain hex dumps."""


@main.command("apis")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
def apis_command(as_json: bool) -> None:
    """List every Kafka API the tool decodes, with its request and response versions."""
    listing = []
    for key, api in sorted(apis().items()):
        req, resp = version_range(key, "request"), version_range(key, "response")
        listing.append({"api_key": key, "name": api["name"],
                        "request_versions": list(req), "response_versions": list(resp)})
    if as_json:
        click.echo(json.dumps(listing, indent=1))
        return
    from rich.table import Table

    table = Table(title=f"{len(listing)} Kafka APIs", header_style="bold")
    for col in ("key", "name", "request versions", "response versions"):
        table.add_column(col)
    for a in listing:
        table.add_row(str(a["api_key"]), a["name"], "v{}-v{}".format(*a["request_versions"]),
                      "v{}-v{}".format(*a["response_versions"]))
    make_console().print(table)


@main.command("explain")
@click.argument("hex_text", nargs=-1)
@click.option("-f", "--file", "path", metavar="FILE", help="Read the hex dump (or the raw bytes) from a file.")
@click.option("--request", "kind", flag_value="request", help="The bytes are a request.")
@click.option("--response", "kind", flag_value="response", help="The bytes are a response.")
@click.option("--api-key", "api", metavar="NAME|KEY", help="API of a response, by name or key (from its request).")
@click.option("--api-version", type=int, help="API version of a response (from its request).")
@click.option("--full", is_flag=True, help="Show long values whole.")
@click.option("--json", "as_json", is_flag=True, help="The decoded tree and byte map as JSON.")
def explain_command(hex_text, path, kind, api, api_version, full, as_json) -> None:
    """Annotate every byte of a Kafka request or response given as hex.

    HEX may be given as arguments, with --file, or on standard input. Plain hex,
    0x00 style, xxd, hexdump -C, od -An -tx1, tcpdump -x/-X/-XX and tshark -x dumps are accepted
    (of whole packets too: their link, IP and TCP headers are left out), and the byte
    tables of decode --hex --full; // and # comments are skipped. A file or standard input that is not text (the message
    saved as it is) is taken as the bytes. The 4-byte size prefix is optional.
    """
    from kafkasniff.protocol.identify import identify
    from kafkasniff.render.explain import print_explanation, write_explanation_json
    from kafkasniff.render.hexinput import parse_hex_blocks, read_input
    from kafkasniff.render.output import stdout_gone

    if (api is None) != (api_version is None):
        fail("--api-key and --api-version go together: give both, the API and version of the request answered")
    api_key = None if api is None else api_key_named("--api-key", api)
    if api_key is not None:
        side = kind or "response"
        lowest, highest = version_range(api_key, side)
        if not lowest <= api_version <= highest:
            fail(f"--api-version {api_version}: Kafka defines {apis()[api_key]['name']} {side}s v{lowest}-v{highest}; "
                 "give one of those")
    try:
        if path:
            given = read_input_file(path)
        elif hex_text:
            given = " ".join(hex_text)
        else:
            if sys.stdin.isatty():
                click.echo("reading hex from standard input (end with Ctrl-D)…", err=True)
            given = read_input(sys.stdin.buffer)
        blocks = None if isinstance(given, bytes) else parse_hex_blocks(given)
    except ValueError as e:
        fail(f"cannot read the hex dump: {e}")
    if blocks is None:
        data = given
        click.echo(f"took the input's {len(data)} bytes as they are (it is not text)", err=True)
    elif not blocks:
        fail("no hex bytes found in the input; give the message as hex (00 01 ...), a hex dump or its raw bytes "
             "(see kafkasniff explain --help)")
    else:
        data, taken = kafka_bytes(blocks)
        if taken:
            click.echo(taken, err=True)
    del given, blocks  # their bytes are in data: not held twice (a dump may hold 16 MiB)
    if not data:
        fail("the packets in the dump carry no TCP payload")
    ident = identify(data, kind, api_key, api_version)
    try:
        if as_json:
            write_explanation_json(sys.stdout, ident, data)
        else:
            print_explanation(make_console(), ident, data, None if full else 64)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as decode does
        stdout_gone()


def read_input_file(path: str) -> str | bytes:
    """The text of the dump, or the bytes, that the file of --file holds; a file that cannot be read is a CLI error."""
    from kafkasniff.render.hexinput import read_input

    try:
        with open(path, "rb") as f:
            return read_input(f)
    except FileNotFoundError:
        fail(f"cannot read {path}: no such file; check the path")
    except IsADirectoryError:
        fail(f"cannot read {path}: it is a directory; give --file a file")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def kafka_bytes(blocks: list) -> tuple[bytes, str | None]:
    """The bytes to explain in the blocks of a hex dump, and what was taken when not all of them:
    tshark's reassembled TCP data when the dump has some; else each block, without its link, IP and
    TCP headers when it is a whole packet."""
    from kafkasniff.capture.packets import dumped_packet_payload

    reassembled = [block.data for block in blocks if block.source == "Reassembled TCP"]
    if reassembled:
        data = b"".join(reassembled)
        return data, f"took tshark's reassembled TCP data ({len(data)} bytes)"
    parts, packets, headers = [], 0, {}
    for block in blocks:
        found = dumped_packet_payload(block.data)
        if found is None:
            parts.append(block.data)
            continue
        payload, layers = found
        parts.append(payload)
        packets += 1
        headers[layers] = headers.get(layers, 0) + len(block.data) - len(payload)
    if not packets:
        return b"".join(parts), None
    left_out = "; ".join(f"{layers} headers, {size} bytes" for layers, size in headers.items())
    return b"".join(parts), (f"took the TCP payload of {packets} packet{'s' if packets > 1 else ''} "
                             f"({left_out} left out)")


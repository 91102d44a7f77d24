"""Tables written to a file or pipe: laid out here, as rich lays out tables that fit, without its cost."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kafkasniff.render.tables import print_tables, table_text


def _table() -> Table:
    table = Table(title="per topic", title_justify="left", header_style="bold", show_edge=False)
    table.add_column("topic")
    table.add_column("records", justify="right")
    table.add_row(Text("orders[x]"), "1,024")
    table.add_row("payments", "7")
    table.add_row("two\nlines", "")
    return table


def test_table_text_draws_title_header_rule_and_rows():
    assert table_text(_table()) == (
        "per topic\n"
        " topic     ┃ records\n"
        "━━━━━━━━━━━╇━━━━━━━━━\n"
        " orders[x] │   1,024\n"
        " payments  │       7\n"
        " two       │\n"
        " lines     │\n"
    )


def test_table_text_is_rich_layout_without_trailing_spaces():
    drawn = io.StringIO()
    Console(file=drawn, width=200, highlight=False).print(_table())
    assert table_text(_table()) == "".join(line.rstrip() + "\n" for line in drawn.getvalue().splitlines())


def test_print_tables_to_a_file_leaves_an_empty_line_after_each():
    out = io.StringIO()
    print_tables([_table(), _table()], out)
    assert out.getvalue() == (table_text(_table()) + "\n") * 2

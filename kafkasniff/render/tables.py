"""Tables written out: rich's drawing on a terminal, the same layout as plain lines to a file or pipe.

rich lays a table out cell by cell (measuring, wrapping, styling): about 2-3 ms per row of ten columns, which
made printing `--stats` of a busy capture cost as much as decoding it. A file or pipe needs no styles and no
wrapping, so there the rows are padded and joined here, in the same box characters.
"""

from __future__ import annotations

from typing import TextIO

from rich.table import Table


def print_tables(tables: list[Table], out: TextIO) -> None:
    """Each table, then an empty line."""
    if out.isatty():
        from rich.console import Console

        console = Console(file=out, highlight=False)
        for table in tables:
            console.print(table)
            console.print()
        return
    out.write("".join(table_text(table) + "\n" for table in tables))


def table_text(table: Table) -> str:
    """The table as lines: its title, the header, a rule, then the rows; a cell's lines stay in its column."""
    headers = [str(column.header) for column in table.columns]
    columns = [[str(cell).split("\n") for cell in column.cells] for column in table.columns]
    widths = [max([len(header), *(len(line) for cell in cells for line in cell)])
              for header, cells in zip(headers, columns)]
    right = [column.justify == "right" for column in table.columns]

    def line(texts: list[str], separator: str) -> str:
        cells = [text.rjust(width) if r else text.ljust(width) for text, width, r in zip(texts, widths, right)]
        return f" {separator.join(cells)} ".rstrip() + "\n"

    out = [f"{table.title}\n"] if table.title else []
    out.append(line(headers, " ┃ "))
    out.append("╇".join("━" * (width + 2) for width in widths) + "\n")
    for row in zip(*columns):
        for i in range(max(len(cell) for cell in row)):
            out.append(line([cell[i] if i < len(cell) else "" for cell in row], " │ "))
    return "".join(out)

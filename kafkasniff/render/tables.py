"""Tables written out: rich's drawing on a terminal, the same layout as plain lines to a file or pipe.

rich lays a table out cell by cell (measuring, wrapping, styling): about 2-3 ms per row of ten columns, which
made printing `--stats` of a busy capture cost as much as decoding it. A file or pipe needs no styles and no
wrapping, so there the rows are padded and joined here, in the same box characters. The byte tables of `explain`
(hundreds of thousands of rows) are laid out here too, a line at a time (--hex's: render/bytemap.pyx).
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator, TextIO

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from kafkasniff.render.values import Pieces


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


# --- the byte tables of --hex and explain: aligned columns, two spaces apart; the last column unpadded --------------

def _plain(text: str) -> bool:
    """Printable ASCII only: as wide on a terminal as it is long."""
    return text.isascii() and text.isprintable()


def _width(cell: str) -> int:
    """Terminal cells the text takes: its length when printable ASCII, as offsets, hex, field paths and types are
    (measuring each character's width took a seventh of --hex)."""
    return len(cell) if _plain(cell) else cell_len(cell)


def column_widths(header: tuple[str, ...], cells: Iterable[tuple]) -> list[int]:
    """The width of every column but the last. Cells given as a list are measured a column at a time; others
    (explain's, made as they are measured so as not to be held) a row at a time."""
    if not isinstance(cells, list):
        widths = [_width(h) for h in header[:-1]]
        columns = range(len(widths))
        for row in cells:
            for i in columns:
                width = _width(row[i])
                if width > widths[i]:
                    widths[i] = width
        return widths
    widths = []
    for i, title in enumerate(header[:-1]):
        column = [row[i] for row in cells]
        joined = "".join(column)  # one check of the whole column: measured cell by cell only when it must be
        widest = max(map(len if _plain(joined) else _width, column), default=0)
        widths.append(max(widest, _width(title)))
    return widths


def table_lines(header: tuple[str, ...], cells: list) -> Iterator[Text]:
    """The table's lines, styled (the header bold), made one at a time. Cells are str or Text."""
    widths = column_widths(header, cells)
    for row, style in [(header, "bold"), *((c, "") for c in cells)]:
        line = Text(style=style)
        for cell, width in zip(row, widths):
            line.append(cell)
            line.append(" " * (width - cell_len(cell) + 2))
        line.append(row[-1])
        yield line


def write_table(out: TextIO, header: tuple[str, ...], cells: Iterable[tuple], widths: list[int] | None = None) -> None:
    """table_lines as plain text, written a line at a time: a table can have hundreds of thousands of rows, and a
    styled line costs about a kilobyte. Cells are str; the last may be Pieces, written a piece at a time. Given
    the widths (column_widths), the cells may be made as they are written."""
    if widths is None:
        widths = column_widths(header, cells)
    for row in itertools.chain((header,), cells):
        padded = "".join([cell.ljust(width + 2) if _plain(cell) else cell + " " * (width - cell_len(cell) + 2)
                          for cell, width in zip(row, widths)])
        last = row[-1]
        if type(last) is Pieces:
            out.write(padded)
            for piece in last.pieces:
                out.write(piece)
            out.write("\n")
        else:
            out.write(padded + last + "\n")

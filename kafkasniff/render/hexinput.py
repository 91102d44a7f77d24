"""Turn a pasted hex dump into bytes, for `kafkasniff explain`.

Accepted: plain hex (any spacing, `0x` prefixes, commas), `xxd`, `hexdump -C`, `tcpdump -x/-X/-XX`,
`tshark -x` and `od -An -tx1` output, and the byte tables of `decode --hex --full`; `//` and `#` start comments.
The dump format is recognised once for the whole text from the shape of its offset column, and each line's ASCII
column is then cut off by that format's layout, so text in the ASCII column is never read as hex, however hex-like
it looks.

In a dump with offsets, lines without an offset (tcpdump's packet summary, a pasted prompt) are skipped,
and each offset must continue the previous line (or restart at 0, as a new tcpdump packet does), so a
skipped data line cannot go unnoticed. A `*` line (a run of repeated lines) is expanded from the offsets.
Where the offset restarts at 0, a new block begins (a packet of tcpdump or tshark); tshark's names of its
data sources (`Frame (74 bytes):`, `Reassembled TCP (1048 bytes):`) name the blocks that follow them, up
to the blank line that ends the packet.

A dump is one message, pasted or saved: its text may be up to MAX_DUMP_TEXT characters (bytes, read from a file)
and its bytes, runs of repeated lines included, up to MAX_DUMP_BYTES; beyond, it is refused before anything that
size is made. Lines are read one at a time, and an error quotes at most the start of the text it is about. A file
that is not text (read_input: it has NUL bytes) is the message's bytes themselves.
"""

import re
from typing import BinaryIO, Iterator, NamedTuple

MiB = 1 << 20
MAX_DUMP_TEXT = 16 * MiB
MAX_DUMP_BYTES = 16 * MiB
EXCERPT = 40  # characters of the text an error quotes
TOO_MUCH_TEXT = f"more than {MAX_DUMP_TEXT // MiB} MiB of text; a dump holds one message: keep its lines only"

_COMMENT = re.compile(r"//|#")
_LINE = re.compile("([^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]*)(?:\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])?")
# xxd `00000010: 0000 0012  ....` and tcpdump `\t0x0010:  4500 0034  E..4`: ASCII after a 2+ space gap.
_COLON_OFFSET = re.compile(r"\s*(?:0x)?([0-9a-fA-F]+):(?:\s+(.*))?")
_ASCII_GAP = re.compile(r"\s{2,}")
# hexdump -C `00000010  00 00 00 12  00 03 ...  |....|`, ASCII between bars; the last line is a bare offset.
_HEXDUMP_C = re.compile(r"([0-9a-fA-F]{8,})(?:  ([^|]*)\|.*)?")
# tshark -x `0010  00 3c dd db 40 00 ...   .<..@.`: a bare offset, two spaces, bytes, the ASCII column;
# recognised by a full line (16 bytes), which plain hex does not make.
_SPACED_OFFSET = re.compile(r"([0-9a-fA-F]{4,})  ((?:[0-9a-fA-F]{2} )*[0-9a-fA-F]{2})(?: {2,}.*)?")
_SPACED_OFFSET_FULL = re.compile(r"[0-9a-fA-F]{4,}  (?:[0-9a-fA-F]{2} ){15}[0-9a-fA-F]{2} {3}.{1,16}")
# The byte tables of `decode --hex` and `explain`: a header line, then rows such as
# `12-32   00 13 6b 61 …  header.ClientId  ...` (decimal offsets; the bytes cut to 8 unless --full); the heading line
# of each message is skipped.
_BYTE_TABLE_HEADER = re.compile(r"offset +bytes +field +type +value")
_BYTE_TABLE_ROW = re.compile(r"(\d+)(?:-\d+)? {2,}(\S+(?: \S+)*)(?: {2,}.*)?")
_SOURCE_NAME = re.compile(r"(\S.*) \(\d+ bytes\):")
_TOKEN = re.compile(r"(?:0[xX])?([0-9a-fA-F]+)")

_Split = tuple[int | None, str] | None  # (offset, hex area), or None for a line that carries no bytes


class Block(NamedTuple):
    source: str | None  # the name tshark gives the data source, e.g. "Reassembled TCP"
    data: bytes


def parse_hex_dump(text: str) -> bytes:
    """Return the bytes of a hex dump; raise ValueError naming the line of any unreadable text."""
    return b"".join(block.data for block in parse_hex_blocks(text))


def read_dump(stream) -> str:
    """The text of a dump from a text stream; raise ValueError when it is longer than MAX_DUMP_TEXT."""
    text = stream.read(MAX_DUMP_TEXT + 1)
    if len(text) > MAX_DUMP_TEXT:
        raise ValueError(TOO_MUCH_TEXT)
    return text


def read_input(stream: BinaryIO) -> str | bytes:
    """What a file or standard input holds: the text of a dump, or its bytes when it has NUL bytes, which text does
    not and Kafka's integers put in any frame (a message saved as it is); raise ValueError past MAX_DUMP_TEXT bytes of
    text or MAX_DUMP_BYTES bytes."""
    raw = stream.read(max(MAX_DUMP_TEXT, MAX_DUMP_BYTES) + 1)
    if b"\0" in raw:
        if len(raw) > MAX_DUMP_BYTES:
            raise ValueError(f"more than {MAX_DUMP_BYTES // MiB} MiB of bytes; a message is at most that: give one")
        return raw
    if len(raw) > MAX_DUMP_TEXT:
        raise ValueError(TOO_MUCH_TEXT)
    return raw.decode("utf-8", errors="replace")


def _lines(text: str) -> Iterator[str]:
    """The lines of the text (as str.splitlines cuts them) without comments or trailing blanks, one at a time."""
    for match in _LINE.finditer(text):
        if match.end() == match.start():  # the empty match at the end of the text
            return
        yield _COMMENT.split(match[1], maxsplit=1)[0].rstrip()


def _excerpt(text: str) -> str:
    """The text quoted, or its start when it is long."""
    if len(text) <= EXCERPT:
        return repr(text)
    return f"{text[:EXCERPT]!r}… ({len(text):,} characters)"


def parse_hex_blocks(text: str) -> list[Block]:
    """The bytes of a hex dump, as the blocks (packets) it holds; raise ValueError naming the line of any
    unreadable text, or when the text or its bytes exceed MAX_DUMP_TEXT or MAX_DUMP_BYTES."""
    if len(text) > MAX_DUMP_TEXT:
        raise ValueError(TOO_MUCH_TEXT)
    split_line = _line_splitter(text)
    blocks: list[Block] = []
    source = block_source = None  # the name in force, and that of the block being read
    out = bytearray()
    previous: tuple[int | None, bytes] | None = None
    repeat_pending = False
    size = 0  # bytes of the blocks so far
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            source = None  # tshark ends each packet with a blank line; its sources are named within
            continue
        named = _SOURCE_NAME.fullmatch(line.strip())
        if named:
            if out:
                blocks.append(Block(block_source, bytes(out)))
                size += len(out)
                out.clear()
            source = named[1]
            continue
        if line.strip() == "*":
            if previous is None or previous[0] is None or not previous[1]:
                raise ValueError(f"line {number}: '*' (repeated lines) needs offsets around it; dump with -v")
            repeat_pending = True
            continue
        try:
            split = split_line(line)
        except ValueError as e:
            raise ValueError(f"line {number}: {e}") from None
        if split is None:
            continue
        offset, area = split
        data = _hex_bytes(area, number)
        if offset is not None and previous is not None and previous[0] is not None:
            prev_offset, prev_data = previous
            expected = prev_offset + len(prev_data)
            if repeat_pending:
                gap = offset - expected
                if gap < 0 or gap % len(prev_data):
                    raise ValueError(f"line {number}: offset {offset:#x} does not end a run of repeated lines")
                if size + len(out) + gap > MAX_DUMP_BYTES:
                    raise ValueError(f"line {number}: offset {offset:#x} would repeat the line before '*' past "
                                     f"the {MAX_DUMP_BYTES // MiB} MiB a dump may hold")
                out += prev_data * (gap // len(prev_data))
                repeat_pending = False
            elif offset not in (expected, 0):
                raise ValueError(f"line {number}: offset {offset:#x} does not follow the previous line "
                                 f"(expected {expected:#x})")
        if offset == 0 and out:
            blocks.append(Block(block_source, bytes(out)))
            size += len(out)
            out.clear()
        if not out:
            block_source = source
        out += data
        if size + len(out) > MAX_DUMP_BYTES:
            raise ValueError(f"line {number}: more than the {MAX_DUMP_BYTES // MiB} MiB a dump may hold")
        previous = (offset, data)
    if repeat_pending:
        raise ValueError("'*' (repeated lines) at the end of the dump has no closing offset")
    if out:
        blocks.append(Block(block_source, bytes(out)))
    return blocks


def _line_splitter(text: str):
    if any(_BYTE_TABLE_HEADER.fullmatch(line.strip()) for line in _lines(text)):
        return _split_byte_table_row
    if any(_COLON_OFFSET.fullmatch(line) for line in _lines(text)):
        return _split_colon_offset
    if any((m := _HEXDUMP_C.fullmatch(line)) and m[2] is not None for line in _lines(text)):
        return _split_hexdump_c
    if any(_SPACED_OFFSET_FULL.fullmatch(line) for line in _lines(text)):
        return _split_spaced_offset
    return lambda line: (None, line)


def _split_colon_offset(line: str) -> _Split:
    match = _COLON_OFFSET.fullmatch(line)
    if match is None:
        return None
    area = _ASCII_GAP.split(match[2] or "", maxsplit=1)[0]
    return int(match[1], 16), area


def _split_spaced_offset(line: str) -> _Split:
    match = _SPACED_OFFSET.fullmatch(line)
    if match is None:
        return None
    return int(match[1], 16), match[2]


def _split_hexdump_c(line: str) -> _Split:
    match = _HEXDUMP_C.fullmatch(line)
    if match is None:
        return None
    return int(match[1], 16), match[2] or ""


def _split_byte_table_row(line: str) -> _Split:
    match = _BYTE_TABLE_ROW.fullmatch(line)
    if match is None:
        return None
    shown = match[2]
    if shown.endswith(" …"):
        raise ValueError("the row shows only the first bytes of its range; make the table with decode --hex --full")
    if "•" in shown:
        raise ValueError("the bytes of a secret are masked (••); make the table with decode --hex --full "
                         "--show-secrets")
    return int(match[1]), shown


def _hex_bytes(area: str, number: int) -> bytes:
    digits = []
    for token in area.replace(",", " ").split():
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise ValueError(f"line {number}: {_excerpt(token)} is not hex")
        if len(match[1]) % 2:
            raise ValueError(f"line {number}: {_excerpt(token)} has an odd number of hex digits")
        digits.append(match[1])
    return bytes.fromhex("".join(digits))

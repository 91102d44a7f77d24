"""Work out what a bare frame is when nobody says: request or response, which API, which version.

Used by `explain` on a hex dump and by pairing for responses whose request was
not captured. A candidate counts only if its schema consumes the bytes exactly;
among several, the least suspicious wins (fewest unknown error codes, illegal
nulls and unknown tags), then the lowest API key and version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.interpreter import NOT_NULLABLE, RecordsExpander
from kafkasniff.protocol.messages import (Message, all_versions, decode_request, decode_response,
                                          decode_response_for_request)


def has_size_prefix(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from(">i", data)[0] == len(data) - 4


def suspicion(msg: Message) -> int:
    """How many decoded values look implausible for this interpretation."""
    score = 0
    stack: list[Field] = [f for f in msg.fields()]
    while stack:
        f = stack.pop()
        note = f.note
        if note and (note == NOT_NULLABLE or note.startswith("UNKNOWN(") or note.startswith("unknown tag")):
            score += 1
        if f.children:
            stack.extend(f.children)
    return score


def rank(candidates: list[Message]) -> list[Message]:
    return sorted(candidates, key=lambda m: (suspicion(m), m.api_key, m.api_version))


def infer_response(buf, pos: int = 0, end: int | None = None,
                   expand_records: RecordsExpander | None = None) -> list[Message]:
    """Every response interpretation that consumes the bytes exactly, most plausible first."""
    fits = []
    for key, version in all_versions("response"):
        msg = decode_response(buf, key, version, pos, end)
        if msg.complete:
            fits.append(msg)
    ranked = rank(fits)
    if ranked and expand_records is not None:
        best = ranked[0]
        ranked[0] = decode_response(buf, best.api_key, best.api_version, pos, end, expand_records)
    return ranked


@dataclass
class Identification:
    message: Message
    has_size_prefix: bool
    assumed: str | None = None          # why this reading was chosen, when it was a guess
    alternatives: list[tuple[str, int]] = field(default_factory=list)


def identify(data: bytes, kind: str | None = None, api_key: int | None = None, api_version: int | None = None,
             expand_records: RecordsExpander | None = None) -> Identification:
    prefixed = has_size_prefix(data)
    start = 4 if prefixed else 0
    if kind != "request" and api_key is not None and api_version is not None:
        msg = decode_response_for_request(data, api_key, api_version, start, None, expand_records)
        if kind == "response" or msg.complete:
            return Identification(msg, prefixed)
    if kind != "response":
        msg = decode_request(data, start, None, expand_records)
        if kind == "request" or msg.complete:
            return Identification(msg, prefixed)
    fits = infer_response(data, start, None, expand_records)
    if fits:
        best, others = fits[0], fits[1:]
        why = (f"assumed a {best.api_name} v{best.api_version} response: it is the most plausible of "
               f"{len(fits)} response schemas that consume the bytes exactly" if others else
               f"assumed a {best.api_name} v{best.api_version} response: the only schema that consumes the "
               f"bytes exactly")
        return Identification(best, prefixed, why, [(m.api_name, m.api_version) for m in others])
    return Identification(decode_request(data, start, None, expand_records), prefixed,
                          "no request or response schema consumes these bytes exactly; shown as a request")

"""Work out what a bare frame is when nobody says: request or response, which API, which version.

Used by `explain` on a hex dump and by pairing for responses whose request was
not captured. A candidate counts only if its schema consumes the bytes exactly;
among several, the least suspicious wins (fewest unknown error codes, illegal
nulls and unknown tags), then the lowest API key and version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from kafkasniff.protocol.messages import (Message, all_versions, decode_request, decode_response,
                                          decode_response_for_request, with_fields)


def has_size_prefix(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from(">i", data)[0] == len(data) - 4


# Records made as Fields for an explanation; past it they are counted (see messages.field_trees).
RECORDS_EXPLAINED = 10_000


def infer_response(buf, pos: int = 0, end: int | None = None,
                   usual: frozenset[tuple[int, int]] = frozenset()) -> list[Message]:
    """Every response interpretation that consumes the bytes exactly, most plausible first (summaries only):
    least suspicious; among equals, the APIs and versions in `usual` (what the client is seen to send),
    then the lowest API key and version."""
    fits = []
    for key, version in all_versions("response"):
        msg = decode_response(buf, key, version, pos, end, skim=True)
        if msg.complete:
            fits.append(msg)
    usual_keys = {key for key, _ in usual}
    return sorted(fits, key=lambda m: (m.suspicion, (m.api_key, m.api_version) not in usual,
                                       m.api_key not in usual_keys, m.api_key, m.api_version))


@dataclass
class Identification:
    message: Message
    has_size_prefix: bool
    assumed: str | None = None          # why this reading was chosen, when it was a guess
    alternatives: list[tuple[str, int]] = field(default_factory=list)  # other response schemas that fit
    suggestion: str | None = None       # when the schema asked for does not fit: the readings that do


def identify(data: bytes, kind: str | None = None, api_key: int | None = None,
             api_version: int | None = None) -> Identification:
    """The most plausible reading of `data`, with its Field trees."""
    found = _identified(data, kind, api_key, api_version)
    with_fields(found.message, data, record_limit=RECORDS_EXPLAINED)
    return found


def _as_asked(data: bytes, start: int, prefixed: bool, kind: str | None, api_key: int,
              api_version: int) -> Identification:
    """The bytes read with the schema asked for (a request only if its header says that very API and
    version); where that schema does not fit, the readings that do are suggested."""
    request = decode_request(data, start, None, skim=True)
    request_fits = request.malformed is None
    if kind is None and request_fits and (request.api_key, request.api_version) == (api_key, api_version):
        return Identification(request, prefixed)
    msg = decode_response_for_request(data, api_key, api_version, start, None, skim=True)
    if msg.complete:
        return Identification(msg, prefixed)
    fits = [f"{m.api_name} v{m.api_version} response" for m in infer_response(data, start, None)]
    how = "--api-key/--api-version"
    if request_fits and kind is None:
        fits.insert(0, f"{request.api_name} v{request.api_version} request")
        how = "--request, or " + how
    suggestion = None
    if fits:
        shown = ", ".join(fits[:12]) + (f" and {len(fits) - 12} more" if len(fits) > 12 else "")
        suggestion = (f"a {msg.api_name or f'API {api_key}'} v{api_version} response does not fit these bytes "
                      f"exactly; these do: {shown} (pick one with {how})")
    return Identification(msg, prefixed, suggestion=suggestion)


def _identified(data: bytes, kind: str | None, api_key: int | None, api_version: int | None) -> Identification:
    prefixed = has_size_prefix(data)
    start = 4 if prefixed else 0
    if kind != "request" and api_key is not None and api_version is not None:
        return _as_asked(data, start, prefixed, kind, api_key, api_version)
    if kind != "response":
        msg = decode_request(data, start, None, skim=True)
        if kind == "request" or msg.complete:
            return Identification(msg, prefixed)
    fits = infer_response(data, start, None)
    if fits:
        best, others = fits[0], fits[1:]
        why = (f"assumed a {best.api_name} v{best.api_version} response: it is the most plausible of "
               f"{len(fits)} response schemas that consume the bytes exactly" if others else
               f"assumed a {best.api_name} v{best.api_version} response: the only schema that consumes the "
               f"bytes exactly")
        return Identification(best, prefixed, why, [(m.api_name, m.api_version) for m in others])
    return Identification(decode_request(data, start, None, skim=True), prefixed,
                          "no request or response schema consumes these bytes exactly; shown as a request")

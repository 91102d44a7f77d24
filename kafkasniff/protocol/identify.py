"""Work out what a bare frame is when nobody says: request or response, which API, which version.

Used by `explain` on a hex dump and by pairing for responses whose request was
not captured. A candidate counts only if its schema consumes the bytes exactly;
among several, the least suspicious wins (fewest unknown error codes, illegal
nulls and unknown tags), then the lowest API key and version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import NamedTuple

from kafkasniff.protocol.messages import (Message, all_versions, decode_request, decode_response,
                                          decode_response_for_request, response_schemas, screen_responses,
                                          with_fields)
from kafkasniff.protocol.schema import api_name


def has_size_prefix(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from(">i", data)[0] == len(data) - 4


# Records made as Fields for an explanation; past it they are counted (see messages.field_trees).
RECORDS_EXPLAINED = 10_000
# The work of inferring a response whose request was not captured, bounded by its size: every response schema
# is screened (a walk that makes nothing, a step per value) within SCREEN_STEPS_PER_BYTE steps per byte of the
# frame in all (plus SCREEN_STEPS_SPARE, so that small frames try every schema whatever they hold); decoding
# makes objects for what the body holds, so only the best reading is decoded.
SCREEN_STEPS_PER_BYTE = 4
SCREEN_STEPS_SPARE = 1 << 20


class Screened(NamedTuple):
    """The response schemas that fit a frame, as far as its steps went."""

    fits: list[tuple[int, int]]  # (API key, version), most plausible first
    untried: int                 # schemas not screened: the frame's steps ran out first

    def nothing_fits(self) -> str:
        if not self.untried:
            return "no response schema fits these bytes"
        return (f"none of the {len(all_versions_list('response')) - self.untried} response schemas tried fits these "
                f"bytes ({self.untried} not tried: the work per frame is bounded by its size)")


def response_fits(buf, pos: int = 0, end: int | None = None,
                  usual: frozenset[tuple[int, int]] = frozenset()) -> Screened:
    """The response schemas that consume the bytes exactly, most plausible first: least suspicious; among
    equals, the APIs and versions in `usual` (what the client is seen to send), then the lowest API key and
    version. Schemas are screened in that order of preference (usual ones first) until the frame's steps are
    spent; those left are counted as untried."""
    end = len(buf) if end is None else min(end, len(buf))
    candidates, schemas = _screening_order(frozenset(kv for kv in usual if kv[0] in _response_keys()))
    fits, tried = screen_responses(schemas, buf, pos, end, SCREEN_STEPS_PER_BYTE * (end - pos) + SCREEN_STEPS_SPARE)
    # candidates are in order of preference: among equally suspicious fits, the first screened wins
    fits.sort(key=lambda fit: (fit[1], fit[0]))
    return Screened([candidates[index] for index, _ in fits], len(candidates) - tried)


@lru_cache(maxsize=256)
def _screening_order(usual: frozenset[tuple[int, int]]) -> tuple[tuple[tuple[int, int], ...], list]:
    """Every response (API key, version) in order of preference given the usual requests, and their schemas."""
    everything = all_versions_list("response")
    usual_keys = {key for key, _ in usual}
    candidates = (tuple(kv for kv in everything if kv in usual) +
                  tuple(kv for kv in everything if kv[0] in usual_keys and kv not in usual) +
                  tuple(kv for kv in everything if kv[0] not in usual_keys))
    return candidates, response_schemas(candidates)


@cache
def _response_keys() -> frozenset[int]:
    return frozenset(key for key, _ in all_versions_list("response"))


def infer_response(buf, pos: int = 0, end: int | None = None, usual: frozenset[tuple[int, int]] = frozenset(),
                   screened: Screened | None = None) -> tuple[Message | None, Screened]:
    """The most plausible response reading of the bytes (a summary; None when no schema fits), from
    response_fits (`screened`: its answer, when known), and that answer."""
    if screened is None:
        screened = response_fits(buf, pos, end, usual)
    for key, version in screened.fits:
        msg = decode_response(buf, key, version, pos, end, skim=True)
        if msg.complete:  # the screen agrees with the summary; this only guards against a disagreement
            return msg, screened
    return None, screened


@cache
def all_versions_list(kind: str) -> tuple[tuple[int, int], ...]:
    return tuple(all_versions(kind))


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
    fits = [f"{api_name(key)} v{version} response" for key, version in response_fits(data, start, None).fits]
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
    best, screened = infer_response(data, start, None)
    fits = screened.fits
    if best is not None:
        others = [(key, version) for key, version in fits if (key, version) != (best.api_key, best.api_version)]
        why = (f"assumed a {best.api_name} v{best.api_version} response: it is the most plausible of "
               f"{len(fits)} response schemas that consume the bytes exactly" if others else
               f"assumed a {best.api_name} v{best.api_version} response: the only schema that consumes the "
               f"bytes exactly")
        return Identification(best, prefixed, why, [(api_name(key), version) for key, version in others])
    nothing = ("no request or response schema consumes these bytes exactly" if not screened.untried else
               f"no request schema consumes these bytes exactly, and {screened.nothing_fits()}")
    return Identification(decode_request(data, start, None, skim=True), prefixed, f"{nothing}; shown as a request")

"""Work out what a bare frame is when nobody says: request or response, which API, which version.

Used by `explain` on a hex dump and by pairing for responses whose request was
not captured. A candidate counts only if its schema consumes the bytes exactly;
among several, the least suspicious wins (fewest values no broker sends: error
codes Kafka does not define, negative throttle times, node ids and offsets below
-1, ports outside -1..65535, names with control characters; illegal nulls and
unknown tags), then the one the connection's requests make likeliest (_screening_order),
then the lowest API key and version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import NamedTuple

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.messages import (Message, all_versions, decode_request, decode_response,
                                          decode_response_for_request, response_schemas, screen_responses,
                                          with_fields)
from kafkasniff.protocol.schema import api_name, message_variant


def declared_size(data: bytes) -> int | None:
    """The size the first 4 bytes declare, were they a size prefix; None when they cannot be one."""
    if len(data) < 4:
        return None
    size = struct.unpack_from(">i", data)[0]
    return size if size >= 0 else None


def has_size_prefix(data: bytes) -> bool:
    return declared_size(data) == len(data) - 4


def with_article(name: str) -> str:
    """`name` after "a" or "an": every Kafka API name, and "API 99", sounds as it is spelled at its start."""
    return f"{'an' if name[:1] in 'AEIOUaeiou' else 'a'} {name}"


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

    def others(self, api_key: int, api_version: int) -> list[tuple[str, int]]:
        """The readings that fit besides (api_key, api_version), most plausible first, as (API name, version)."""
        return [(api_name(key), version) for key, version in self.fits if (key, version) != (api_key, api_version)]

    def besides(self, api_key: int, api_version: int) -> str:
        """What else may be read of the bytes, for an inferred response's line: `; also fits Fetch v13-v15 v17,
        Metadata v1; 40 schemas not tried`, or nothing."""
        others = self.others(api_key, api_version)
        return (f"; also fits {readings_text(others)}" if others else "") + (
            f"; {self.untried} schemas not tried" if self.untried else "")

    def nothing_fits(self) -> str:
        if not self.untried:
            return "no response schema fits these bytes"
        return (f"none of the {len(all_versions_list('response')) - self.untried} response schemas tried fits these "
                f"bytes ({self.untried} not tried: the work per frame is bounded by its size)")


# A line naming the readings that fit some bytes names at most this many APIs (a response of a few bytes fits
# dozens); --json lists every reading.
APIS_SHOWN = 3


def readings_text(readings: list[tuple[str, int]]) -> str:
    """(API name, version)s as `Fetch v13-v15 v17, Metadata v1 and 4 more APIs`: each API's versions together,
    ascending, runs of consecutive versions joined, the APIs in the order of their first reading."""
    by_name: dict[str, list[int]] = {}
    for name, version in readings:
        by_name.setdefault(name, []).append(version)
    shown = [f"{name} {_version_runs(sorted(versions))}" for name, versions in list(by_name.items())[:APIS_SHOWN]]
    more = f" and {len(by_name) - APIS_SHOWN} more APIs" if len(by_name) > APIS_SHOWN else ""
    return ", ".join(shown) + more


def _version_runs(versions: list[int]) -> str:
    """Ascending versions as `v13-v15 v17`: runs of consecutive versions joined."""
    runs: list[list[int]] = []
    for version in versions:
        if runs and version == runs[-1][1] + 1:
            runs[-1][1] = version
        else:
            runs.append([version, version])
    return " ".join(f"v{low}" if low == high else f"v{low}-v{high}" for low, high in runs)


def response_fits(buf, pos: int = 0, end: int | None = None, at_hand: frozenset[tuple[int, int]] = frozenset(),
                  sent: frozenset[tuple[int, int]] = frozenset()) -> Screened:
    """The response schemas that consume the bytes exactly, most plausible first: least suspicious; among
    equals, the first in _screening_order's ranking by what the connection says: `at_hand`, the (API key,
    version)s of the requests awaiting an answer, and `sent`, those the client was seen sending on it. Schemas
    are screened in that order until the frame's steps are spent; those left are counted as untried."""
    end = len(buf) if end is None else min(end, len(buf))
    candidates, schemas = _screening_order(_with_responses(at_hand), _with_responses(sent))
    fits, tried = screen_responses(schemas, buf, pos, end, SCREEN_STEPS_PER_BYTE * (end - pos) + SCREEN_STEPS_SPARE)
    # candidates are in order of preference: among equally suspicious fits, the first screened wins
    fits.sort(key=lambda fit: (fit[1], fit[0]))
    return Screened([candidates[index] for index, _ in fits], len(candidates) - tried)


def _with_responses(requests: frozenset[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """The requests of APIs that have responses: the others rank nothing, and would only make more cache keys."""
    keys = _response_keys()
    return frozenset(kv for kv in requests if kv[0] in keys)


@lru_cache(maxsize=256)
def _screening_order(at_hand: frozenset[tuple[int, int]],
                     sent: frozenset[tuple[int, int]]) -> tuple[tuple[tuple[int, int], ...], list]:
    """Every response (API key, version) in order of preference, and their schemas. Tiers: the versions of the
    requests at hand; those the client sent before on the connection (a lost request is most likely of a kind
    it sends, whether or not one is waiting); other versions of those APIs; the rest. Within a tier, the lowest
    API key and version first (some layouts are shared by several versions)."""
    asked_keys = {key for key, _ in at_hand | sent}

    def tier(kv: tuple[int, int]) -> int:
        return 0 if kv in at_hand else 1 if kv in sent else 2 if kv[0] in asked_keys else 3

    candidates = tuple(sorted(all_versions_list("response"), key=tier))  # a stable sort: lowest first in a tier
    return candidates, response_schemas(candidates)


@cache
def _response_keys() -> frozenset[int]:
    return frozenset(key for key, _ in all_versions_list("response"))


def infer_response(buf, pos: int = 0, end: int | None = None, at_hand: frozenset[tuple[int, int]] = frozenset(),
                   sent: frozenset[tuple[int, int]] = frozenset(),
                   screened: Screened | None = None) -> tuple[Message | None, Screened]:
    """The most plausible response reading of the bytes (a summary; None when no schema fits), from
    response_fits (`screened`: its answer, when known), and that answer."""
    if screened is None:
        screened = response_fits(buf, pos, end, at_hand, sent)
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
    following: str | None = None        # the whole frames that the bytes after the frame begin with


def identify(data: bytes, kind: str | None = None, api_key: int | None = None,
             api_version: int | None = None) -> Identification:
    """The most plausible reading of `data`, with its Field trees."""
    found = _identified(data, kind, api_key, api_version)
    with_fields(found.message, data, record_limit=RECORDS_EXPLAINED)
    return found


def _identified(data: bytes, kind: str | None, api_key: int | None, api_version: int | None) -> Identification:
    """The frame after a size prefix that agrees with the dump's length, as ever. Otherwise the first 4 bytes
    may still be the prefix of a frame that the dump cuts short, or that more bytes follow: that reading is
    weighed when its header names an API and version Kafka defines (or the ones asked for)."""
    if has_size_prefix(data):
        return _read(data, 4, len(data), kind, api_key, api_version)
    unprefixed = _read(data, 0, len(data), kind, api_key, api_version)
    size = declared_size(data)
    if size is None:
        return unprefixed
    prefixed = _read(data, 4, min(4 + size, len(data)), kind, api_key, api_version)
    if prefixed.message.body_offset is None:  # the dump holds no header of an API and version Kafka defines there
        return unprefixed
    inferred = prefixed.message.kind == "response" and api_key is None  # fits its frame exactly by construction
    if not inferred and _agrees_with_its_size(prefixed.message, data, size):
        # as good as a frame whose prefix agrees with the dump: it wins over a guess and over a reading without a
        # prefix that goes wrong, but not over one decided to the last byte without a guess (as ever)
        taken = not (unprefixed.message.complete and unprefixed.assumed is None)
    else:
        taken = _valid_to(prefixed.message) > _valid_to(unprefixed.message)
    return _with_bytes_after_frame(prefixed, data) if taken else unprefixed


def cut_request(data: bytes) -> bool:
    """Whether `data` is the start of a size-prefixed request frame that it cuts short (a direction's bytes when
    the capture ended inside its first frame): its header names an API and version Kafka defines, and read with
    zeros for the missing bytes, it breaks only where `data` stops. It takes the size, the API key and its
    version at least (8 bytes) to tell a request."""
    size = declared_size(data)
    if size is None or not 8 <= len(data) < 4 + size:
        return False
    msg = decode_request(data, 4, len(data), skim=True)
    return message_variant(msg.api_key, "request", msg.api_version) is not None and \
        _agrees_with_its_size(msg, data, size)


def _valid_to(msg: Message) -> int:
    """The offset up to which the reading explains the bytes without fault."""
    if msg.malformed is not None:
        return msg.malformed.offset
    return msg.trailing.offset if msg.trailing is not None else msg.end


# Zeros stand in for the bytes a dump cut short lacks, up to this many, to see whether its frame breaks only where
# the dump stops: enough for the fields of most frames, without making the 2 GB a size prefix may declare.
PADDING_AT_MOST = 1 << 20


def _agrees_with_its_size(msg: Message, data: bytes, size: int) -> bool:
    """Does the frame after the size prefix, as read in `msg`, end where its size says? When the dump stops inside
    it: read again with zeros standing in for the bytes it lacks, does it break only where the dump stops?"""
    if msg.end == 4 + size:
        return msg.complete
    padded = data + bytes(min(4 + size - len(data), PADDING_AT_MOST))
    return _valid_to(_decoded_like(msg, padded, 4, 4 + size)) >= len(data)


def _decoded_like(like: Message, buf: bytes, start: int, end: int) -> Message:
    """buf[start:end] decoded as `like` was: a request by its own header, a response with `like`'s schema."""
    if like.kind == "request":
        return decode_request(buf, start, end, skim=True)
    return decode_response(buf, like.api_key, like.api_version, start, end, skim=True)


def _with_bytes_after_frame(found: Identification, data: bytes) -> Identification:
    """The bytes after the frame the size prefix declares are trailing bytes of a complete message, and said
    to be frames of their own where they begin with some (each is explained on its own)."""
    msg = found.message
    if msg.end == len(data) or msg.malformed is not None:  # a malformed message leaves them undecoded
        return found
    start = msg.trailing.offset if msg.trailing is not None else msg.end
    msg.trailing = Field("_trailing", "bytes", start, len(data) - start, bytes(data[start:]), None,
                         f"{len(data) - start} bytes after the end of the body")
    frames = _whole_frames(data, msg.end, msg)
    if frames:
        them = "it on its own" if len(frames) == 1 else "them one at a time"
        ending = "" if frames[-1][1] == len(data) else f", then {len(data) - frames[-1][1]} bytes"
        found.following = (f"the bytes after the frame begin with {len(frames)} more size-prefixed "
                           f"frame{'s' if len(frames) > 1 else ''} ({', '.join(name for name, _ in frames)}"
                           f"{ending}); explain {them}")
    return found


def _whole_frames(data: bytes, at: int, like: Message) -> list[tuple[str, int]]:
    """The complete size-prefixed frames from `at` on, read as `like` was (a request by its header, a response
    by the schema `like` has), each as its name and where it ends."""
    frames = []
    while (size := declared_size(data[at:at + 4])) is not None and at + 4 + size <= len(data):
        msg = _decoded_like(like, data, at + 4, at + 4 + size)
        if not msg.complete:
            break
        frames.append((f"{msg.api_name} v{msg.api_version} {msg.kind}", at + 4 + size))
        at += 4 + size
    return frames


def _read(data: bytes, start: int, end: int, kind: str | None, api_key: int | None,
          api_version: int | None) -> Identification:
    """The most plausible reading of the frame in data[start:end] (after a size prefix when start is 4)."""
    prefixed = start == 4
    cut = prefixed and end - 4 < declared_size(data)  # the dump stops inside the frame
    if kind != "request" and api_key is not None and api_version is not None:
        return _as_asked(data, start, end, prefixed, cut, kind, api_key, api_version)
    if kind != "response":
        msg = decode_request(data, start, end, skim=True)
        if kind == "request" or msg.complete:
            return Identification(msg, prefixed)
    if cut:  # no schema can consume a frame cut short exactly: any that did would be a coincidence
        why = (f"the dump holds {end - 4} of the {declared_size(data)} bytes its size prefix declares: shown as a "
               f"request (a response cut short is not inferred: give --api-key/--api-version)")
        return Identification(decode_request(data, start, end, skim=True), prefixed, why)
    best, screened = infer_response(data, start, end)
    fits = screened.fits
    if best is not None:
        others = [(key, version) for key, version in fits if (key, version) != (best.api_key, best.api_version)]
        assumed = f"assumed {with_article(best.api_name)} v{best.api_version} response"
        why = (f"{assumed}: it is the most plausible of {len(fits)} response schemas that consume the bytes exactly"
               if others else f"{assumed}: the only schema that consumes the bytes exactly")
        return Identification(best, prefixed, why, [(api_name(key), version) for key, version in others])
    nothing = ("no request or response schema consumes these bytes exactly" if not screened.untried else
               f"no request schema consumes these bytes exactly, and {screened.nothing_fits()}")
    return Identification(decode_request(data, start, end, skim=True), prefixed, f"{nothing}; shown as a request")


def _as_asked(data: bytes, start: int, end: int, prefixed: bool, cut: bool, kind: str | None, api_key: int,
              api_version: int) -> Identification:
    """The bytes read with the schema asked for (a request only if its header says that very API and
    version); where that schema does not fit a whole frame, the readings that do are suggested."""
    request = decode_request(data, start, end, skim=True)
    request_fits = request.malformed is None
    if kind is None and request_fits and (request.api_key, request.api_version) == (api_key, api_version):
        return Identification(request, prefixed)
    msg = decode_response_for_request(data, api_key, api_version, start, end, skim=True)
    if msg.complete or cut:  # where a cut frame stops is what there is to say
        return Identification(msg, prefixed)
    fits = [f"{api_name(key)} v{version} response" for key, version in response_fits(data, start, end).fits]
    how = "--api-key/--api-version"
    if request_fits and kind is None:
        fits.insert(0, f"{request.api_name} v{request.api_version} request")
        how = "--request, or " + how
    suggestion = None
    if fits:
        shown = ", ".join(fits[:12]) + (f" and {len(fits) - 12} more" if len(fits) > 12 else "")
        asked = with_article(msg.api_name or f"API {api_key}")
        suggestion = (f"{asked} v{api_version} response does not fit these bytes exactly; these do: {shown} "
                      f"(pick one with {how})")
    return Identification(msg, prefixed, suggestion=suggestion)

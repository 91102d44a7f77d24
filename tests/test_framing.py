"""The framer's big frames, copied into their payloads as their bytes come (framing.FILL_FROM), give exactly what
gathering them in the buffer gives: the same frames, times and offsets, and the same reports of bytes lost in a gap
or at the end, wherever the segments and the gaps fall."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.stream import framing
from kafkasniff.stream.framing import Frame, Framer, Plausibility, Skipped


class AnyFrame(Plausibility):
    """Out of sync, every position may start a frame that decodes (the framer's own rules decide)."""

    def __init__(self):
        super().__init__(4, 0)

    def header(self, buf, pos: int, end: int) -> bool | None:
        return None if end - pos < self.header_bytes else True  # as the sessions': None until it can tell

    def frame(self, buf, pos: int, end: int) -> bool:
        return True


def run(pieces: list[bytes | int], fill: bool) -> list:
    """Feed pieces (bytes, or the size of a gap) with times 1, 2, ...; then close."""
    saved = framing.FILL_FROM
    framing.FILL_FROM = saved if fill else 1 << 62
    try:
        framer = Framer(AnyFrame())
        out = []
        for ts, piece in enumerate(pieces, 1):
            out += framer.feed(piece, float(ts)) if isinstance(piece, bytes) else framer.gap(piece, float(ts))
        return out + framer.close()
    finally:
        framing.FILL_FROM = saved


def frame(size: int, fill: int) -> bytes:
    return struct.pack(">i", size) + bytes([fill % 256]) * size


def cut_up(stream: bytes, cuts: list[int], gap_at: int | None, gap_size: int) -> list[bytes | int]:
    """The stream in pieces of the sizes `cuts` (over and over), piece gap_at lost in a gap of gap_size bytes."""
    pieces, at = [], 0
    for cut in cuts * (len(stream) // sum(cuts) + 1):
        if at >= len(stream):
            break
        pieces.append(stream[at:at + cut])
        at += cut
    if gap_at is not None and gap_at < len(pieces):
        pieces[gap_at] = gap_size  # those bytes were never captured
    return pieces


@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples each run (5,000 random ones passed)
@given(sizes=st.lists(st.sampled_from([4, 100, 4000, 70_000, 300_000, 600_000]), min_size=1, max_size=6),
       cuts=st.lists(st.integers(1, 200_000), min_size=1, max_size=40),
       gap_at=st.one_of(st.none(), st.integers(0, 39)), gap_size=st.integers(1, 100_000),
       cut_short=st.integers(0, 50_000))
def test_big_frames_filled_as_they_come_are_what_the_buffer_gives(sizes, cuts, gap_at, gap_size, cut_short):
    stream = b"".join(frame(size, i) for i, size in enumerate(sizes))
    pieces = cut_up(stream[:max(1, len(stream) - cut_short)], cuts, gap_at, gap_size)  # the last may never end
    filled = run(pieces, fill=True)
    assert filled == run(pieces, fill=False)
    assert all(type(item) in (Frame, Skipped) for item in filled)


def test_a_big_frame_in_many_segments_is_one_frame_dated_by_its_first_and_last():
    big = frame(1 << 20, 7)
    pieces = [big[i:i + 65_536] for i in range(0, len(big), 65_536)] + [frame(10, 1)]
    out = run(pieces, fill=True)
    assert out == [Frame(big[4:], 0, 17.0, 1.0), Frame(frame(10, 1)[4:], len(big), 18.0, 18.0)]


def test_a_size_prefix_alone_reserves_nothing_until_an_eighth_of_the_frame_has_come():
    framer = Framer(AnyFrame())
    framer.feed(struct.pack(">i", 100 << 20) + bytes(1000), 1.0)  # names 100 MB, brings 1 KB
    assert framer.close() == [Skipped(0, 1004, "stream ended inside a frame (1000 of 104857600 bytes)", 1.0)]


def test_a_big_frame_found_by_resynchronising_is_dated_by_the_piece_that_brought_its_first_byte():
    """After a gap the bytes are dated piece by piece, and a big frame among them is left to the buffer's dating
    (found by hypothesis: it was dated by the piece that brought the eighth of it that starts the filling)."""
    pieces = cut_up(frame(4, 0) + frame(4, 1) + frame(70_000, 2), [3], 0, 1)  # 3 bytes a piece, the first lost
    filled = run(pieces, fill=True)
    assert filled == run(pieces, fill=False)
    # its size prefix starts at byte 14: in piece 6, which came at time 6
    assert filled[-2:] == [Frame(frame(4, 1)[4:], 6, 6.0, 3.0), Frame(frame(70_000, 2)[4:], 14, 23_340.0, 6.0)]


@pytest.mark.parametrize("lost_after", [65_540, 200_000])
def test_a_gap_inside_a_big_frame_loses_what_came_of_it(lost_after):
    big = frame(300_000, 3)
    out = run([big[:40_000], big[40_000:lost_after], 5_000, frame(8, 2)], fill=True)
    assert out[0] == Skipped(0, lost_after, "partial frame lost in a gap", 3.0)
    assert out[1] == Skipped(lost_after, 5_000, "bytes missing from the capture", 3.0, False)


LOST = "partial frame lost in a gap"
MISSING = "bytes missing from the capture"


def test_after_a_gap_inside_a_frame_whose_size_came_the_next_frame_starts_where_that_one_ends():
    """A frame's size prefix says where it ends: after a gap inside it, the rest of it is dropped (and reported) and
    the next frame cut from there, in sync, without a search (which cannot prove a frame it has nothing to check
    against: a response whose request was lost); a gap past that end leaves the boundary unknown."""
    first, second = frame(100, 1), frame(8, 2)
    assert run([first[:30], 50, first[80:], second], fill=False) == [
        Skipped(0, 30, LOST, 2.0), Skipped(30, 50, MISSING, 2.0, False), Skipped(80, 24, LOST, 3.0),
        Frame(second[4:], 104, 4.0, 4.0)]
    assert run([first[:30], 50, first[80:90], 4, first[94:] + second], fill=False) == [
        Skipped(0, 30, LOST, 2.0), Skipped(30, 50, MISSING, 2.0, False), Skipped(80, 10, LOST, 4.0),
        Skipped(90, 4, MISSING, 4.0, False), Skipped(94, 10, LOST, 5.0), Frame(second[4:], 104, 5.0, 5.0)]
    assert run([first[:30], 74, second], fill=False) == [  # the gap ends at the frame's end
        Skipped(0, 30, LOST, 2.0), Skipped(30, 74, MISSING, 2.0, False), Frame(second[4:], 104, 3.0, 3.0)]
    assert run([first[:30], 50, first[80:90]], fill=False) == [  # the stream ends inside it
        Skipped(0, 30, LOST, 2.0), Skipped(30, 50, MISSING, 2.0, False), Skipped(80, 10, LOST, 3.0)]
    assert run([first[:30], 80, second[6:]], fill=False)[2].reason == "resynchronised after a gap"  # past its end
    assert run([first[:3], 50, first[53:]], fill=False)[2].reason == "resynchronised after a gap"  # size not whole


class Asked(Plausibility):
    """Refuses every frame, noting each candidate it is asked about (its size and first header bytes)."""

    def __init__(self):
        super().__init__(4, 0)
        self.starts = []

    def header(self, buf, pos: int, end: int) -> bool:
        self.starts.append(bytes(buf[pos - 4:pos + 4]))
        return False

    def frame(self, buf, pos: int, end: int) -> bool:
        raise AssertionError("every candidate was refused by its header")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400) | st.lists(st.sampled_from(b"\x00\x01\x03\x04\x05\x7f\x80\xff"), max_size=400)
       .map(bytes), requests=st.booleans(), max_frame=st.sampled_from([100 << 20, 1 << 24, (1 << 24) - 1, 65536,
                                                                       5 << 16, (1 << 31) - 1]),
       cut=st.integers(1, 64))
def test_out_of_sync_every_position_with_a_plausible_size_and_header_is_judged_once_in_order(data, requests,
                                                                                           max_frame, cut):
    """A capture starting mid-connection is searched byte by byte (a 2 MB Fetch response's tail, say): a position
    is asked about when its size lies from MIN_FRAME to the limit and, for requests, the API key and version are
    below 256 (their high bytes 0), for responses the correlation id is not negative; each once, in stream order,
    however the bytes come."""
    asked = Asked()
    framer = Framer(asked, max_frame, synced=False, requests=requests)
    for at in range(0, len(data), cut):
        framer.feed(data[at:at + cut], 1.0)
    framer.close()
    expected = [data[at:at + 8] for at in range(len(data) - framing.CANDIDATE_BYTES + 1)
                if framing.MIN_FRAME <= struct.unpack_from(">i", data, at)[0] <= max_frame
                and (data[at + 4] == 0 and data[at + 6] == 0 if requests else data[at + 4] < 0x80)]
    assert asked.starts == expected


def test_a_response_older_than_every_request_waiting_is_judged_against_those_waiting_at_each_search():
    """Out of sync, the broker's direction takes a frame whose request was not captured if its correlation id is
    below every request still waiting (brokers answer in order). What is waiting changes as responses pair: each
    search looks at it anew (a search works it out once, not once per candidate: up to MAX_PENDING requests wait)."""
    from kafkasniff.protocol.encoder import encode_request, encode_response
    from kafkasniff.stream.session import MessageEvent, NoticeEvent, Session
    from kafkasniff.stream.tcp import Endpoint

    def response(correlation_id: int) -> bytes:
        return encode_response(18, 2, correlation_id, {"error_code": 0, "api_keys": [], "throttle_time_ms": 0})

    session = Session(0, (Endpoint("10.0.0.1", 50000), Endpoint("10.0.0.2", 9092)), client_side=0)
    session.data(0, b"".join(encode_request(18, 2, i, "c", {}) for i in range(10)), 1.0)
    session.gap(1, 100, 1.1)
    # a size and a correlation id that no waiting request has and that is not below them all: refused
    not_a_response = struct.pack(">ii", 14, 100)
    answered = session.data(1, not_a_response + b"".join(response(i) for i in range(5)), 1.2)
    assert [e.message.correlation_id for e in answered if type(e) is MessageEvent] == [0, 1, 2, 3, 4]
    assert sorted(session.pending) == [5, 6, 7, 8, 9]
    session.gap(1, 50, 1.3)
    # 3 was answered already: its request is not waiting, and 3 is below the oldest waiting (5), so it may be a
    # response to a request not captured; against what waited at the first search (0), it could not
    events = session.data(1, response(3) + response(5), 1.4)
    messages = [e for e in events if type(e) is MessageEvent]
    assert [(e.message.correlation_id, e.inferred) for e in messages] == [(3, True), (5, False)]
    assert not [e for e in events if type(e) is NoticeEvent and e.kind == "skipped"]

"""Consumer groups of the KIP-848 protocol (ConsumerGroupHeartbeat) and share groups (ShareGroupHeartbeat), which
the test broker (Tansu 0.6) does not implement: their conversations are built here with the project's encoder,
heartbeat by heartbeat as Apache Kafka's group coordinator answers them (member epochs, target assignments handed
out as the partitions are revoked, members removed and fenced), and `kafkasniff groups` must tell each generation
exactly: members, assignments with topic ids named by the capture's Metadata, causes, errors and events. Then
heartbeats in any order, as damaged or hostile traffic would have them, must still give a timeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from pcapkit import TcpConversation, merged, write_pcap
from kafkasniff.analyses.insight import Insight
from kafkasniff.analyses.wire import Asked, Seen
from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.render.insight import group_tables
from kafkasniff.render.tables import table_text

T0 = 1_700_000_000  # 2023-11-14 22:13:20 UTC
BROKER = ("10.0.0.2", 9092)
FETCH, METADATA, CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT = 1, 3, 68, 76
UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH = 25, 110


class Client:
    """One client connection to the broker: requests at given times (seconds after T0), each answered 2 ms
    later, or never."""

    def __init__(self, client_id: str, address: tuple[str, int], opened_at: float):
        self.client_id = client_id
        self.conversation = TcpConversation(address, BROKER, start=T0 + opened_at - 0.001)
        self.correlation_id = 0

    def call(self, at: float, api_key: int, version: int, request: dict, response: dict | None) -> None:
        self.correlation_id += 1
        conversation = self.conversation
        conversation.ts = T0 + at - 0.0001  # (each segment goes out 0.1 ms after the last)
        conversation.send(True, encode_request(api_key, version, self.correlation_id, self.client_id, request))
        if response is not None:
            conversation.ts = T0 + at + 0.002 - 0.0001
            conversation.send(False, encode_response(api_key, version, self.correlation_id, response))

    def close(self, at: float) -> list:
        self.conversation.ts = T0 + at - 0.0001
        return self.conversation.close()


def metadata(client: Client, at: float, topics: dict[str, tuple[str, int]]) -> None:
    """Metadata v12 for the topics ({name: (topic id, partitions)}): it names their ids."""
    client.call(at, METADATA, 12, {"Topics": [{"Name": name} for name in topics]}, {
        "Brokers": [{"NodeId": 1, "Host": BROKER[0], "Port": BROKER[1]}], "ClusterId": "kafkasniff", "ControllerId": 1,
        "Topics": [{"Name": name, "TopicId": topic_id, "Partitions": [
            {"PartitionIndex": p, "LeaderId": 1, "ReplicaNodes": [1], "IsrNodes": [1]} for p in range(partitions)]}
            for name, (topic_id, partitions) in topics.items()]})


def fetch(client: Client, at: float, topic_id: str, offsets: dict[int, int], high_watermark: int) -> None:
    """Fetch v13 (topics by id) from the offsets ({partition: offset}), answered with the high watermark."""
    client.call(at, FETCH, 13, {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 52428800,
                                "SessionEpoch": -1, "Topics": [{"TopicId": topic_id, "Partitions": [
                                    {"Partition": p, "FetchOffset": offset, "PartitionMaxBytes": 1048576}
                                    for p, offset in offsets.items()]}]},
                {"Responses": [{"TopicId": topic_id, "Partitions": [
                    {"PartitionIndex": p, "HighWatermark": high_watermark, "LastStableOffset": high_watermark,
                     "Records": None} for p in offsets]}]})


def assignment(partitions: dict[str, list[int]] | None) -> dict | None:
    return None if partitions is None else {
        "TopicPartitions": [{"TopicId": topic_id, "Partitions": p} for topic_id, p in partitions.items()]}


# --- a KIP-848 consumer group --------------------------------------------------------------------------------

ORDERS = "6f1d7b3c-2a4e-4c8f-9b0d-5e7a1c3f9d21"  # topic "orders", 3 partitions
M1, M2, M3 = "q0dLzyB1RUe0rHc9LrJ2Xw", "Vt9Xt0yuTJa2Qj5LqRcYcw", "bW7kPz3SRcKmN2hT8fQa1g"


class ConsumerMember:
    """A consumer of the group `orders-app`, or another (ConsumerGroupHeartbeat v1: the member id is its own)."""

    def __init__(self, client: Client, member_id: str, group: str = "orders-app"):
        self.client, self.member_id, self.group = client, member_id, group

    def heartbeat(self, at: float, epoch: int, answer: int | None, given: dict | None = None, *, full: bool = False,
                  owned: dict | None = None, error: int = 0) -> None:
        """A heartbeat at `epoch` answered with epoch `answer` and assignment `given` (None: unchanged), or with
        `error`; a full one (joining) carries the subscription and the partitions owned."""
        request = {"GroupId": self.group, "MemberId": self.member_id, "MemberEpoch": epoch,
                   "RebalanceTimeoutMs": -1, "SubscribedTopicNames": None, "TopicPartitions": None}
        if full:
            request.update(RebalanceTimeoutMs=300000, SubscribedTopicNames=["orders"], ServerAssignor="uniform",
                           TopicPartitions=[])
        elif owned is not None:
            request["TopicPartitions"] = assignment(owned)["TopicPartitions"]
        if error:
            response = {"ErrorCode": error, "ErrorMessage": "The coordinator is not aware of this member.",
                        "MemberEpoch": 0}
        else:
            response = {"MemberId": self.member_id, "MemberEpoch": answer, "HeartbeatIntervalMs": 5000,
                        "Assignment": assignment(given)}
        self.client.call(at, CONSUMER_GROUP_HEARTBEAT, 1, request, response)


def consumer_group_capture(path: Path) -> Path:
    """Three consumers join `orders-app` one after another (topic `orders`, 3 partitions, uniform assignor); the
    second stalls past its session timeout and is removed, then rejoins; the third leaves."""
    c1 = Client("orders-c1", ("10.0.0.11", 50001), 0)
    c2 = Client("orders-c2", ("10.0.0.12", 50002), 6)
    c3 = Client("orders-c3", ("10.0.0.13", 50003), 16)
    one, two, three = ConsumerMember(c1, M1), ConsumerMember(c2, M2), ConsumerMember(c3, M3)
    one.heartbeat(0, 0, 1, {ORDERS: [0, 1, 2]}, full=True)        # epoch 1: all three partitions
    metadata(c1, 0.05, {"orders": (ORDERS, 3)})                    # the client names the topic id it was given
    fetch(c1, 1, ORDERS, {0: 0, 1: 0, 2: 0}, 10)
    one.heartbeat(5, 1, 1, owned={ORDERS: [0, 1, 2]})
    two.heartbeat(6, 0, 2, {}, full=True)     # epoch 2, target c1 [0,1], c2 [2]: partition 2 waits for c1
    one.heartbeat(10, 1, 1, {ORDERS: [0, 1]})                      # c1 revokes 2 ...
    one.heartbeat(10.1, 1, 2, owned={ORDERS: [0, 1]})              # ... and moves to epoch 2
    two.heartbeat(11, 2, 2, {ORDERS: [2]}, owned={})               # c2 gets partition 2
    one.heartbeat(15, 2, 2)
    three.heartbeat(16, 0, 3, {}, full=True)  # epoch 3, target c1 [0], c2 [2], c3 [1]
    two.heartbeat(16.5, 2, 3)                                      # nothing to revoke: epoch 3 at once
    one.heartbeat(20, 2, 2, {ORDERS: [0]})
    one.heartbeat(20.1, 2, 3, owned={ORDERS: [0]})
    three.heartbeat(21, 3, 3, {ORDERS: [1]}, owned={})
    two.heartbeat(21.5, 3, 3)                 # c2's last heartbeat before it stalls (45 s session timeout)
    for at in range(25, 70, 5):
        one.heartbeat(at, 3, 3)
        three.heartbeat(at + 1, 3, 3)
    # the coordinator removed c2 at 66.5 s: epoch 4, target c1 [0,2], c3 [1]
    one.heartbeat(70, 3, 4, {ORDERS: [0, 2]})
    three.heartbeat(71, 3, 4)
    two.heartbeat(80, 3, None, error=UNKNOWN_MEMBER_ID)           # c2 wakes up: removed
    two.heartbeat(80.1, 0, 5, {}, full=True)  # rejoins with its member id: epoch 5, target c1 [0], c2 [2], c3 [1]
    one.heartbeat(81, 4, 4, {ORDERS: [0]})
    one.heartbeat(81.1, 4, 5, owned={ORDERS: [0]})
    three.heartbeat(82, 4, 5)
    two.heartbeat(83, 5, 5, {ORDERS: [2]}, owned={})
    three.heartbeat(90, -1, -1)                                    # c3 leaves: epoch 6, target c1 [0,1], c2 [2]
    one.heartbeat(91, 5, 6, {ORDERS: [0, 1]})
    two.heartbeat(92, 5, 6)
    fetch(c1, 93, ORDERS, {0: 40, 1: 38}, 45)
    fetch(c2, 93.5, ORDERS, {2: 41}, 45)
    return write_pcap(path, merged(c1.close(95), c2.close(95), c3.close(90.5)))


def at(seconds: float) -> float:
    """A capture time of the conversations, as the capture holds it (microseconds)."""
    return round(T0 + seconds, 6)


def member(member_id: str, client: str, host: str, partitions: list[int] | None, assigned_at: float | None,
           topics: dict | None = None) -> dict:
    return {"member_id": member_id, "client_id": client, "host": host, "instance_id": None, "leader": None,
            "subscription": ["orders"] if topics is None else sorted(topics),
            "assignment": {"orders": partitions} if topics is None else topics,
            "assigned_at": None if assigned_at is None else at(assigned_at)}


def generation(number: int, protocol: str, started: float, formed: float, completed: float | None,
               causes: list[str], members: list[dict], errors: dict | None = None, events: list[str] | None = None,
               assignor: str | None = "uniform") -> dict:
    return {"generation": number, "protocol": protocol, "protocol_type": None, "assignor": assignor,
            "started": at(started), "first_join": None, "formed": at(formed),
            "completed": None if completed is None else at(completed),
            "took_ms": None if completed is None else round((at(completed) - at(started)) * 1000, 3),
            "causes": causes, "errors": errors or {}, "events": events or [], "members": members}


C1, C2, C3 = "10.0.0.11:50001", "10.0.0.12:50002", "10.0.0.13:50003"
CONSUMER_GROUP = {"group_id": "orders-app", "state": "Stable", "after_last_generation": None, "generations": [
    generation(1, "consumer", 0, 0.002, 0.002, [f"orders-c1 ({C1}) joined"],
               [member(M1, "orders-c1", C1, [0, 1, 2], 0.002)]),
    generation(2, "consumer", 6, 6.002, 11.002, [f"orders-c2 ({C2}) joined"],
               [member(M1, "orders-c1", C1, [0, 1], 10.102), member(M2, "orders-c2", C2, [2], 11.002)]),
    generation(3, "consumer", 16, 16.002, 21.002, [f"orders-c3 ({C3}) joined"],
               [member(M1, "orders-c1", C1, [0], 20.102), member(M2, "orders-c2", C2, [2], 16.502),
                member(M3, "orders-c3", C3, [1], 21.002)]),
    generation(4, "consumer", 70.002, 70.002, 71.002,
               ["orders-c2 dropped out without leaving (last answered 22:13:41.502, then UNKNOWN_MEMBER_ID)"],
               [member(M1, "orders-c1", C1, [0, 2], 70.002), member(M3, "orders-c3", C3, [1], 71.002)]),
    generation(5, "consumer", 80.1, 80.102, 83.002, [f"orders-c2 ({C2}) rejoined after UNKNOWN_MEMBER_ID"],
               [member(M1, "orders-c1", C1, [0], 81.102), member(M3, "orders-c3", C3, [1], 82.002),
                member(M2, "orders-c2", C2, [2], 83.002)], errors={"UNKNOWN_MEMBER_ID": 1}),
    generation(6, "consumer", 90, 91.002, 92.002, ["orders-c3 left (heartbeat at epoch -1)"],
               [member(M1, "orders-c1", C1, [0, 1], 91.002), member(M2, "orders-c2", C2, [2], 92.002)]),
]}


# --- a share group ---------------------------------------------------------------------------------------------

JOBS, AUDIT = "0b5e9f4a-7c21-4d8e-a3f6-1e2d4c6b8a90", "93c7e1d2-5b4a-4f60-8e1c-7d2a9b3f5e14"  # 2 and 1 partitions
S1, S2, S3 = "Hk2mQ9xZTfa4L1cN7pWb3g", "c8RvT2nYQ0eJp5Lk9sXw1A", "Zq4Fh7JmSg6W0bNc2VtR8e"


class ShareMember:
    """A consumer of the share group `jobs-share` (ShareGroupHeartbeat v1)."""

    def __init__(self, client: Client, member_id: str):
        self.client, self.member_id = client, member_id

    def heartbeat(self, at: float, epoch: int, answer: int | None, given: dict | None = None, *,
                  topics: list[str] | None = None, error: int = 0, answered: bool = True) -> None:
        request = {"GroupId": "jobs-share", "MemberId": self.member_id, "MemberEpoch": epoch,
                   "SubscribedTopicNames": topics}
        if not answered:
            response = None
        elif error:
            response = {"ErrorCode": error, "ErrorMessage": "The share group member has a smaller member epoch "
                        "(2) than the one known by the group coordinator (4).", "MemberEpoch": 0}
        else:
            response = {"MemberId": self.member_id, "MemberEpoch": answer, "HeartbeatIntervalMs": 5000,
                        "Assignment": assignment(given)}
        self.client.call(at, SHARE_GROUP_HEARTBEAT, 1, request, response)


def share_group_capture(path: Path) -> Path:
    """Three members join `jobs-share` (share groups share partitions: no revoking); the first adds a topic to
    its subscription; two heartbeats of the second reach the coordinator, which moves it to epochs 3 and 4, but
    their answers are lost with the connections it drops after its request timeout, so it comes back at
    epoch 2 and is fenced, and rejoins: given epoch 4 again. Then the first leaves."""
    s1 = Client("jobs-s1", ("10.0.0.21", 51001), 100)
    s2 = Client("jobs-s2", ("10.0.0.22", 51002), 105)
    s2_again = Client("jobs-s2", ("10.0.0.22", 51003), 116)
    s2_third = Client("jobs-s2", ("10.0.0.22", 51004), 146)
    s3 = Client("jobs-s3", ("10.0.0.23", 51005), 110)
    one, three = ShareMember(s1, S1), ShareMember(s3, S3)
    one.heartbeat(100, 0, 1, {JOBS: [0, 1]}, topics=["jobs"])
    metadata(s1, 100.05, {"jobs": (JOBS, 2), "audit": (AUDIT, 1)})
    ShareMember(s2, S2).heartbeat(105, 0, 2, {JOBS: [1]}, topics=["jobs"])
    one.heartbeat(106, 1, 2, {JOBS: [0]})
    three.heartbeat(110, 0, 3, {JOBS: [0]}, topics=["jobs"])
    ShareMember(s2, S2).heartbeat(110.5, 2, None, answered=False)          # epoch 3 for s2: answer lost
    one.heartbeat(111, 2, 3)
    one.heartbeat(115, 3, 4, {JOBS: [0], AUDIT: [0]}, topics=["jobs", "audit"])
    three.heartbeat(115.5, 3, 4)
    ShareMember(s2_again, S2).heartbeat(116, 2, None, answered=False)      # epoch 4 for s2: answer lost
    ShareMember(s2_third, S2).heartbeat(146.1, 2, None, topics=["jobs"], error=FENCED_MEMBER_EPOCH)
    ShareMember(s2_third, S2).heartbeat(146.2, 0, 4, {JOBS: [1]}, topics=["jobs"])
    one.heartbeat(150, -1, -1)
    three.heartbeat(150.5, 4, 5)
    ShareMember(s2_third, S2).heartbeat(151, 4, 5)
    return write_pcap(path, merged(s1.close(150.2), s2.close(140.5), s2_again.close(146), s2_third.close(155),
                                   s3.close(155)))


def share_member(member_id: str, client: str, host: str, topics: dict, assigned_at: float | None,
                 subscription: list[str] = ("jobs",)) -> dict:
    return member(member_id, client, host, None, assigned_at, topics) | {"subscription": list(subscription)}


H1, H2, H2_THIRD, H3 = "10.0.0.21:51001", "10.0.0.22:51002", "10.0.0.22:51004", "10.0.0.23:51005"
SHARE_GROUP = {"group_id": "jobs-share", "state": "Stable", "after_last_generation": None, "generations": [
    generation(1, "share", 100, 100.002, 100.002, [f"jobs-s1 ({H1}) joined"],
               [share_member(S1, "jobs-s1", H1, {"jobs": [0, 1]}, 100.002)], assignor=None),
    generation(2, "share", 105, 105.002, 106.002, [f"jobs-s2 ({H2}) joined"],
               [share_member(S1, "jobs-s1", H1, {"jobs": [0]}, 106.002),
                share_member(S2, "jobs-s2", H2, {"jobs": [1]}, 105.002)], assignor=None),
    # s2's answer at epoch 3 never made it to the capture: the generation is not seen complete
    generation(3, "share", 110, 110.002, None, [f"jobs-s3 ({H3}) joined"],
               [share_member(S1, "jobs-s1", H1, {"jobs": [0]}, 111.002),
                share_member(S2, "jobs-s2", H2, {"jobs": [1]}, None),
                share_member(S3, "jobs-s3", H3, {"jobs": [0]}, 110.002)], assignor=None),
    generation(4, "share", 115, 115.002, 146.202, ["jobs-s1 changed its subscription to audit, jobs"],
               [share_member(S1, "jobs-s1", H1, {"audit": [0], "jobs": [0]}, 115.002, ["audit", "jobs"]),
                share_member(S2, "jobs-s2", H2_THIRD, {"jobs": [1]}, 146.202),  # (from its third connection)
                share_member(S3, "jobs-s3", H3, {"jobs": [0]}, 115.502)],
               errors={"FENCED_MEMBER_EPOCH": 1}, events=[f"jobs-s2 ({H2_THIRD}) rejoined after FENCED_MEMBER_EPOCH"],
               assignor=None),
    generation(5, "share", 150, 150.502, 151.002, ["jobs-s1 left (heartbeat at epoch -1)"],
               [share_member(S2, "jobs-s2", H2_THIRD, {"jobs": [1]}, 151.002),
                share_member(S3, "jobs-s3", H3, {"jobs": [0]}, 150.502)], assignor=None),
]}


# --- the tests -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("groups")
    return {"consumer": consumer_group_capture(folder / "consumer_group.pcap"),
            "share": share_group_capture(folder / "share_group.pcap")}


def groups_json(*paths: Path) -> list[dict]:
    result = CliRunner().invoke(main, ["groups", "--json", *map(str, paths)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout, parse_float=lambda text: round(float(text), 6))


@pytest.mark.parametrize("kind, expected", [("consumer", CONSUMER_GROUP), ("share", SHARE_GROUP)])
def test_each_epoch_is_a_generation_with_its_members_assignments_causes_and_errors(captures, kind, expected):
    assert groups_json(captures[kind]) == [expected]


def test_the_table_of_each_group(captures):
    """Members, hosts at each epoch, assignments named, causes, errors, and the rejoining settled within an
    epoch on a row of its own."""
    result = CliRunner().invoke(main, ["groups", str(captures["consumer"]), str(captures["share"])])
    assert result.exit_code == 0
    assert result.stdout == GROUP_TABLES


GROUP_TABLES = """\
group jobs-share (share protocol): Stable
 gen ┃ formed       ┃ rebalance ms ┃ cause                                                        ┃ errors                ┃ member  ┃ host            ┃ assignment
━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━
   1 │ 22:15:00.002 │          2.0 │ jobs-s1 (10.0.0.21:51001) joined                             │                       │ jobs-s1 │ 10.0.0.21:51001 │ jobs[0,1]
   2 │ 22:15:05.002 │      1,002.0 │ jobs-s2 (10.0.0.22:51002) joined                             │                       │ jobs-s1 │ 10.0.0.21:51001 │ jobs[0]
     │              │              │                                                              │                       │ jobs-s2 │ 10.0.0.22:51002 │ jobs[1]
   3 │ 22:15:10.002 │              │ jobs-s3 (10.0.0.23:51005) joined                             │                       │ jobs-s1 │ 10.0.0.21:51001 │ jobs[0]
     │              │              │                                                              │                       │ jobs-s2 │ 10.0.0.22:51002 │ jobs[1]
     │              │              │                                                              │                       │ jobs-s3 │ 10.0.0.23:51005 │ jobs[0]
   4 │ 22:15:15.002 │     31,202.0 │ jobs-s1 changed its subscription to audit, jobs              │ FENCED_MEMBER_EPOCH×1 │ jobs-s1 │ 10.0.0.21:51001 │ audit[0] jobs[0]
     │              │              │                                                              │                       │ jobs-s2 │ 10.0.0.22:51004 │ jobs[1]
     │              │              │                                                              │                       │ jobs-s3 │ 10.0.0.23:51005 │ jobs[0]
     │ 22:15:46.200 │              │ jobs-s2 (10.0.0.22:51004) rejoined after FENCED_MEMBER_EPOCH │                       │         │                 │
   5 │ 22:15:50.502 │      1,002.0 │ jobs-s1 left (heartbeat at epoch -1)                         │                       │ jobs-s2 │ 10.0.0.22:51004 │ jobs[1]
     │              │              │                                                              │                       │ jobs-s3 │ 10.0.0.23:51005 │ jobs[0]

group orders-app (consumer protocol): Stable
 gen ┃ formed       ┃ rebalance ms ┃ cause                                                                                      ┃ errors              ┃ member    ┃ host            ┃ assignment
━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━
   1 │ 22:13:20.002 │          2.0 │ orders-c1 (10.0.0.11:50001) joined                                                         │                     │ orders-c1 │ 10.0.0.11:50001 │ orders[0,1,2]
   2 │ 22:13:26.002 │      5,002.0 │ orders-c2 (10.0.0.12:50002) joined                                                         │                     │ orders-c1 │ 10.0.0.11:50001 │ orders[0,1]
     │              │              │                                                                                            │                     │ orders-c2 │ 10.0.0.12:50002 │ orders[2]
   3 │ 22:13:36.002 │      5,002.0 │ orders-c3 (10.0.0.13:50003) joined                                                         │                     │ orders-c1 │ 10.0.0.11:50001 │ orders[0]
     │              │              │                                                                                            │                     │ orders-c2 │ 10.0.0.12:50002 │ orders[2]
     │              │              │                                                                                            │                     │ orders-c3 │ 10.0.0.13:50003 │ orders[1]
   4 │ 22:14:30.002 │      1,000.0 │ orders-c2 dropped out without leaving (last answered 22:13:41.502, then UNKNOWN_MEMBER_ID) │                     │ orders-c1 │ 10.0.0.11:50001 │ orders[0,2]
     │              │              │                                                                                            │                     │ orders-c3 │ 10.0.0.13:50003 │ orders[1]
   5 │ 22:14:40.102 │      2,902.0 │ orders-c2 (10.0.0.12:50002) rejoined after UNKNOWN_MEMBER_ID                               │ UNKNOWN_MEMBER_ID×1 │ orders-c1 │ 10.0.0.11:50001 │ orders[0]
     │              │              │                                                                                            │                     │ orders-c3 │ 10.0.0.13:50003 │ orders[1]
     │              │              │                                                                                            │                     │ orders-c2 │ 10.0.0.12:50002 │ orders[2]
   6 │ 22:14:51.002 │      2,002.0 │ orders-c3 left (heartbeat at epoch -1)                                                     │                     │ orders-c1 │ 10.0.0.11:50001 │ orders[0,1]
     │              │              │                                                                                            │                     │ orders-c2 │ 10.0.0.12:50002 │ orders[2]

"""


def test_fetches_count_towards_the_group_whose_epoch_gives_the_partitions(captures):
    """The heartbeats give the partitions by topic id, the Fetches name them (v13: by id, named by Metadata): a
    member's fetch is its group's, before and after the rebalances."""
    result = CliRunner().invoke(main, ["lag", "--json", str(captures["consumer"])], catch_exceptions=False)
    consumers = json.loads(result.stdout)["lag"]["consumers"]
    assert [(c["group"], c["client_id"], c["topic"], c["partition"], c["fetches"], c["last"]["fetch_offset"],
             c["last"]["lag"]) for c in consumers] == [
        ("orders-app", "orders-c1", "orders", 0, 2, 40, 5), ("orders-app", "orders-c1", "orders", 1, 2, 38, 7),
        ("orders-app", "orders-c2", "orders", 2, 2, 41, 4)]


def test_a_fetch_counts_towards_its_group_before_and_after_the_topic_id_is_named(tmp_path):
    """One consumer in two groups, given partitions by topic id: its Fetch of `orders` is the group that holds
    them both before the capture names the id (the fetch names it by id) and after (by name: the assignment is
    read anew when an id is named; by the member alone it would be either group)."""
    c1 = Client("orders-c1", ("10.0.0.11", 50001), 0)
    ConsumerMember(c1, M1).heartbeat(0, 0, 1, {ORDERS: [0, 1, 2]}, full=True)
    ConsumerMember(c1, M2, "audit-app").heartbeat(0.5, 0, 1, {AUDIT: [0]}, full=True)
    fetch(c1, 1, ORDERS, {0: 10}, 15)
    metadata(c1, 2, {"orders": (ORDERS, 3), "audit": (AUDIT, 1)})
    fetch(c1, 3, ORDERS, {0: 12}, 15)
    path = write_pcap(tmp_path / "named_later.pcap", c1.close(4))
    result = CliRunner().invoke(main, ["lag", "--json", str(path)], catch_exceptions=False)
    consumers = json.loads(result.stdout)["lag"]["consumers"]
    assert [(c["group"], c["topic"], c["partition"], c["fetches"], c["last"]["fetch_offset"]) for c in consumers] \
        == [("orders-app", ORDERS, 0, 1, 10), ("orders-app", "orders", 0, 1, 12)]


# --- any order of heartbeats ---------------------------------------------------------------------------------

HEARTBEATS = st.lists(st.tuples(
    st.sampled_from([CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT]), st.sampled_from([M1, M2, M3, ""]),
    st.integers(-2, 6),                                                     # the request's epoch
    st.one_of(st.integers(-2, 8), st.sampled_from([UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH]).map(lambda e: -e)),
    st.one_of(st.none(), st.dictionaries(st.sampled_from([ORDERS, JOBS]), st.lists(st.integers(0, 3), max_size=3))),
    st.one_of(st.none(), st.lists(st.sampled_from(["orders", "jobs"]), max_size=2))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(HEARTBEATS)
def test_heartbeats_in_any_order_give_a_timeline(heartbeats):
    """Epochs up and down, errors, members leaving and coming back in any order: the analysis keeps a timeline
    it can show, each generation's members given their epoch no earlier than it formed."""
    insight = Insight()
    for n, (api, member_id, epoch, answer, given_partitions, topics) in enumerate(heartbeats):
        ts = T0 + n
        request = {"group_id": "g", "member_id": member_id, "member_epoch": epoch, "subscribed_topic_names": topics}
        response = ({"error_code": -answer, "member_id": None, "member_epoch": 0} if answer < -8 else
                    {"error_code": 0, "member_id": member_id or M1, "member_epoch": answer, "assignment":
                     None if given_partitions is None else {"topic_partitions": [
                         {"topic_id": topic_id, "partitions": p} for topic_id, p in given_partitions.items()]}})
        common = (("10.0.0.9", 50000 + n % 3), "c", "request", api, False, (), request, {}, (), (), None)
        insight.take(Seen(ts, n % 3, *common))
        insight.take(Seen(ts + 0.5, n % 3, common[0], "c", "response", api, False,
                          [-answer] if answer < -8 else [], response, {}, (), (), Asked(ts, request, {}, ())))
    found = insight.groups.to_json()
    for group in found:
        for gen in group["generations"]:
            assert all(m["assigned_at"] is None or m["assigned_at"] >= gen["formed"] for m in gen["members"])
            assert gen["completed"] is None or gen["completed"] >= gen["formed"]
    assert len(insight.group_rows()) >= len(found)
    assert all(table_text(table) for table in group_tables(insight.groups))

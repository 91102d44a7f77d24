# cython: language_level=3
"""Consumer groups from the wire: per group, a timeline of generations.

Classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit): a generation is formed by the
JoinGroup responses that carry its id and completed by its SyncGroup responses; its members come from the
leader's JoinGroup response (each member's client id and host from that member's own JoinGroup request),
its assignment from the leader's SyncGroup request and each member's SyncGroup response.

KIP-848 (ConsumerGroupHeartbeat) and share groups (ShareGroupHeartbeat): a generation is a group epoch, first
seen when a heartbeat response gives a member an epoch above the group's; its members are those in the group
then, each with the assignment the heartbeats give it at that epoch (a partition another member still has to
revoke comes in a later heartbeat of the same epoch), and it is complete once every one of them has been given
the epoch and its partitions. Assignments name topics by id: they are named, when shown, from the Metadata
(and similar) responses of the whole capture, which clients often send after their first assignment. A member
the coordinator no longer knows (UNKNOWN_MEMBER_ID: its session or rebalance timed out) was removed before the
first epoch it never reached, which that removal started. A member told to rejoin (FENCED_MEMBER_EPOCH,
UNKNOWN_MEMBER_ID) sends epoch 0 with its member id; when its answer keeps the group's epoch (the coordinator
gives it back its place), the rejoining and the error it followed are events of the current generation rather
than the start of a rebalance.

What started a rebalance is what happened since the generation before was formed: a member joining (a
JoinGroup without a member id, or a member id the last generation did not have; a heartbeat at epoch 0), a
member leaving (LeaveGroup; a heartbeat at epoch -1 or -2), a subscription that changed, a member of the last
generation missing from the new one without having left (its session timed out), and what clients say: a
JoinGroup or LeaveGroup reason, a REBALANCE_IN_PROGRESS answer. Errors in group responses count towards the
rebalance they happen in (a SyncGroup's towards its generation).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from kafkasniff.analyses.wire import (CONSUMER_GROUP_HEARTBEAT, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, OFFSET_COMMIT,
                                      SHARE_GROUP_HEARTBEAT, SYNC_GROUP, Seen)
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.stream.session import endpoint_text

GROUP_APIS = frozenset({OFFSET_COMMIT, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT,
                        SHARE_GROUP_HEARTBEAT})
# The APIs whose messages change generations, members or assignments.
ASSIGNING_APIS = frozenset({JOIN_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT})
MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID = 79, 25
REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
# Member epochs a KIP-848 heartbeat request sends to join and to leave (static members: -2).
JOINING_EPOCH, LEAVING_EPOCHS = 0, (-1, -2)
PROTOCOLS = {CONSUMER_GROUP_HEARTBEAT: "consumer", SHARE_GROUP_HEARTBEAT: "share"}

Assignment = dict[str, list[int]]  # topic -> partitions


@dataclass
class Trigger:
    ts: float
    text: str
    primary: bool  # a membership or subscription change; else something clients said


@dataclass
class MemberInfo:
    """What the capture says about a member, whatever the generation."""

    member_id: str
    client_id: str | None = None
    host: str | None = None                # ip:port of its connection to the coordinator
    instance_id: str | None = None
    session_timeout_ms: int | None = None
    subscription: list[str] | None = None
    ip: str | None = None                  # the address of `host`, as the connections name it
    last_heard: float | None = None
    left_at: float | None = None
    # KIP-848 and share groups
    assignment: Assignment | None = None   # the latest assignment given (topics by id)
    answered_at: float | None = None       # its last heartbeat answered with an epoch
    errors: Counter = field(default_factory=Counter)  # what its heartbeats were told since then
    errors_in: Rebalance | None = None     # the rebalance those errors count towards
    rejoining: Trigger | None = None       # its heartbeat at epoch 0, until answered

    def label(self) -> str:
        return self.client_id if self.client_id is not None else short_id(self.member_id)


@dataclass
class Rebalance:
    """What happened between one generation's forming and the next's."""

    triggers: list[Trigger] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    first_join: float | None = None


@dataclass
class Generation:
    generation: int
    protocol: str                              # classic, consumer (KIP-848) or share
    formed: float
    rebalance: Rebalance
    protocol_type: str | None = None
    assignor: str | None = None
    leader: str | None = None
    members: dict[str, Assignment | None] = field(default_factory=dict)   # member id -> assignment
    subscriptions: dict[str, list[str] | None] = field(default_factory=dict)
    synced: dict[str, float] = field(default_factory=dict)  # member id -> when it got its assignment (epoch)
    errors: Counter = field(default_factory=Counter)        # the generation's own (SyncGroup) errors
    dropped: list[Trigger] = field(default_factory=list)    # members of the one before that vanished
    events: list[Trigger] = field(default_factory=list)     # KIP-848: rejoinings settled within it
    hosts: dict[str, str] = field(default_factory=dict)     # KIP-848: member id -> its host at this epoch

    @property
    def completed(self) -> float | None:
        """When the last member was given its assignment; None while some member has not been."""
        if not self.members or any(member not in self.synced for member in self.members):
            return None
        return max(self.synced[member] for member in self.members)


class Group:
    def __init__(self, group_id: str):
        self.group_id = group_id
        self.generations: list[Generation] = []
        self.by_id: dict[int, Generation] = {}
        self.members: dict[str, MemberInfo] = {}
        self.pending = Rebalance()
        self.joined: set[str] = set()        # member ids whose joining is already a trigger of `pending`
        self.current: dict[str, None] = {}   # KIP-848: members in the group now, in order of joining
        self.server_assignor: str | None = None  # KIP-848: the assignor members last asked for

    @property
    def latest(self) -> Generation | None:
        return self.generations[-1] if self.generations else None

    def member(self, member_id: str) -> MemberInfo:
        info = self.members.get(member_id)
        if info is None:
            info = self.members[member_id] = MemberInfo(member_id)
        return info

    def heard(self, member_id: str | None, ts: float) -> None:
        if member_id:
            self.member(member_id).last_heard = ts

    def trigger(self, ts: float, text: str, primary: bool = True) -> Trigger:
        found = Trigger(ts, text, primary)
        self.pending.triggers.append(found)
        return found

    def form(self, generation: int, protocol: str, ts: float) -> Generation:
        """A generation first seen: what happened since the one before is what started it."""
        gen = Generation(generation, protocol, ts, self.pending)
        self.pending = Rebalance()
        self.joined = set()
        self.generations.append(gen)
        self.by_id[generation] = gen
        return gen

    def state(self) -> str:
        """Empty (every member left), Rebalancing (something happened since the last generation formed, or it
        never completed) or Stable."""
        latest = self.latest
        if latest is not None and latest.members and all(self.member(m).left_at is not None for m in latest.members):
            return "Empty"
        if self.pending.triggers or self.pending.errors or latest is None or latest.completed is None:
            return "Rebalancing"
        return "Stable"


def short_id(member_id: str) -> str:
    return member_id if len(member_id) <= 12 else "…" + member_id[-8:]


cdef class Owners:
    """Which group a consumer's fetch is for (see `owner`), kept by GroupTracker (`owners`)."""

    def __cinit__(self):
        self.by_partition = {}
        self.by_member = {}

    cdef object owner(self, topic, partition, client, host_ip):
        """The group a fetch of this partition by this client id from this host is for: the one whose latest
        generation gives the partition to such a member; else (a member still fetching what a rebalance just
        took from it) the one whose latest generation has such a member; None unless exactly one group does."""
        # Compiled, a C call from lag's _fetch: it runs for every partition of a consumer's Fetch responses.
        found = self.by_partition.get((topic, partition, client, host_ip)) or self.by_member.get((client, host_ip))
        return next(iter(found)) if found is not None and len(found) == 1 else None


class GroupTracker:
    """Feed it every MessageEvent in capture order (`observe`); `groups` has the timelines."""

    def __init__(self, topic_names: TopicNames | None = None):
        self.topic_names = topic_names or TopicNames()
        self.groups: dict[str, Group] = {}
        # owners' index, remade for a group when a message may have changed its generation or assignment, not
        # whole: a consumer's Fetch follows nearly every rebalance, and the index is of every group of the capture
        # (1,000 groups rebalancing five times: `lag` took 17.8 s with the index remade whole, 0.68 s now)
        self._owners = Owners()
        self._indexed: dict[str, tuple[set, set]] = {}  # group -> its keys in the index's two dicts
        self._changed: set[str] = set()  # groups whose keys are to be remade
        self._named = 0  # topic ids named when the index was made (assignments by id are named anew)

    def group(self, group_id: str) -> Group:
        found = self.groups.get(group_id)
        if found is None:
            found = self.groups[group_id] = Group(group_id)
        return found

    def observe(self, s: Seen) -> None:
        if s.api_key not in GROUP_APIS or s.malformed:
            return
        if s.kind == "request":
            handle = _REQUESTS.get(s.api_key)
            if handle is not None and s.body is not None and s.body.get("group_id") is not None:
                handle(self, self._changing(s.api_key, s.body["group_id"]), s, s.body)
            return
        request = s.request.body if s.request is not None else None
        if request is None or s.body is None or request.get("group_id") is None:
            return
        _RESPONSES[s.api_key](self, self._changing(s.api_key, request["group_id"]), s, request, s.body)

    def _changing(self, api_key: int, group_id: str) -> Group:
        """The group a message is about to change; its part of owner's index is remade if the API assigns."""
        if api_key in ASSIGNING_APIS:
            self._changed.add(group_id)
        return self.group(group_id)

    # --- classic protocol ------------------------------------------------------------------------

    def _join_request(self, group: Group, s: Seen, request: dict) -> None:
        member_id = request.get("member_id") or ""
        who = f"{s.client_id} ({endpoint_text(s.client)})"
        subscription = _subscription(request)
        if member_id:
            info = group.member(member_id)
            info.last_heard = s.ts
            latest = group.latest
            if latest is not None and member_id in latest.members:
                before = latest.subscriptions.get(member_id)
                if subscription is not None and before is not None and subscription != before:
                    group.trigger(s.ts, f"{info.label()} changed its subscription to {', '.join(subscription)}")
            elif member_id not in group.joined:
                group.joined.add(member_id)
                group.trigger(s.ts, f"{who} joined")
        else:
            group.trigger(s.ts, f"{who} joined")
        if request.get("reason"):
            group.trigger(s.ts, f"{s.client_id} rejoined: {request['reason']}", primary=False)
        if group.pending.first_join is None:
            group.pending.first_join = s.ts

    def _join_response(self, group: Group, s: Seen, request: dict, response: dict) -> None:
        code = response.get("error_code", 0)
        member_id = response.get("member_id") or request.get("member_id") or ""
        if member_id:
            self._describe(group, member_id, s, request)
        if code:
            group.pending.errors[error_name(code)] += 1
            if code == MEMBER_ID_REQUIRED and member_id:
                group.joined.add(member_id)  # its next JoinGroup is the same joining
            return
        number = response["generation_id"]
        gen = group.by_id.get(number)
        if gen is None:
            gen = group.form(number, "classic", s.ts)
        gen.protocol_type = response.get("protocol_type") or request.get("protocol_type")
        gen.assignor = response.get("protocol_name") or gen.assignor
        gen.leader = response.get("leader") or gen.leader
        gen.members.setdefault(member_id, None)
        gen.subscriptions[member_id] = group.member(member_id).subscription
        for member in response.get("members") or ():  # the leader's answer lists everyone
            mid = member["member_id"]
            gen.members.setdefault(mid, None)
            info = group.member(mid)
            info.instance_id = member.get("group_instance_id") or info.instance_id
            topics = _topics_of(member.get("metadata"))
            if topics is not None:
                info.subscription = gen.subscriptions[mid] = topics
        if response.get("members"):
            self._note_dropped(group, gen)

    def _describe(self, group: Group, member_id: str, s: Seen, request: dict) -> None:
        info = group.member(member_id)
        info.client_id = s.client_id
        info.host, info.ip = endpoint_text(s.client), s.client[0]
        info.instance_id = request.get("group_instance_id") or info.instance_id
        info.session_timeout_ms = request.get("session_timeout_ms", info.session_timeout_ms)
        info.subscription = _subscription(request) or info.subscription
        info.last_heard = s.ts

    def _note_dropped(self, group: Group, gen: Generation) -> None:
        """Members of the generation before that are not in this one and never said they left."""
        index = group.generations.index(gen)
        if index == 0:
            return
        for mid in group.generations[index - 1].members:
            info = group.member(mid)
            if mid in gen.members or (info.left_at is not None and info.left_at <= gen.formed):
                continue
            timeout = f", session timeout {info.session_timeout_ms} ms" if info.session_timeout_ms else ""
            heard = f"last heard {clock(info.last_heard)}" if info.last_heard is not None else "never heard"
            gen.dropped.append(Trigger(info.last_heard or gen.formed,
                                       f"{info.label()} dropped out without leaving ({heard}{timeout})", True))

    def _sync_request(self, group: Group, s: Seen, request: dict) -> None:
        group.heard(request.get("member_id"), s.ts)
        gen = group.by_id.get(request.get("generation_id"))
        if gen is None:
            return
        for entry in request.get("assignments") or ():
            assignment = _assignment_of(entry.get("assignment"))
            if assignment is not None:
                gen.members[entry["member_id"]] = assignment

    def _sync_response(self, group: Group, s: Seen, request: dict, response: dict) -> None:
        code = response.get("error_code", 0)
        gen = group.by_id.get(request.get("generation_id"))
        if code:
            (gen.errors if gen is not None else group.pending.errors)[error_name(code)] += 1
            return
        member_id = request.get("member_id")
        if gen is None or not member_id:
            return
        assignment = _assignment_of(response.get("assignment"))
        if assignment is not None or gen.members.get(member_id) is None:
            gen.members[member_id] = assignment
        gen.synced[member_id] = s.ts

    def _heartbeat_request(self, group: Group, s: Seen, request: dict) -> None:
        group.heard(request.get("member_id"), s.ts)

    def _answered(self, group: Group, s: Seen, request: dict, response: dict) -> None:
        """Heartbeat, LeaveGroup and OffsetCommit responses: their errors; a rebalance the broker signals."""
        for code in s.errors:
            name = error_name(code)
            group.pending.errors[name] += 1
            if name == REBALANCE_IN_PROGRESS and s.api_key == HEARTBEAT:
                group.trigger(s.ts, f"{s.client_id} was told the group is rebalancing", primary=False)

    def _leave_request(self, group: Group, s: Seen, request: dict) -> None:
        leaving = request.get("members") or [{"member_id": request.get("member_id")}]
        for entry in leaving:
            member_id = entry.get("member_id")
            if not member_id:
                continue
            info = group.member(member_id)
            info.left_at = s.ts
            reason = f": {entry['reason']}" if entry.get("reason") else ""
            group.trigger(s.ts, f"{info.label()} left (LeaveGroup{reason})")

    def _commit_request(self, group: Group, s: Seen, request: dict) -> None:
        group.heard(request.get("member_id"), s.ts)

    # --- KIP-848 and share groups ----------------------------------------------------------------

    def _heartbeat_v2_request(self, group: Group, s: Seen, request: dict) -> None:
        member_id, epoch = request.get("member_id") or "", request.get("member_epoch")
        known = group.members.get(member_id) if member_id else None
        who = known.label() if known is not None else f"{s.client_id} ({endpoint_text(s.client)})"
        if member_id:
            group.heard(member_id, s.ts)
        if request.get("server_assignor"):
            group.server_assignor = request["server_assignor"]
        if epoch == JOINING_EPOCH:
            address = f"{s.client_id} ({endpoint_text(s.client)})"
            if known is not None and known.answered_at is not None:  # told to rejoin, or back from leaving
                after = f" after {', '.join(sorted(known.errors))}" if known.errors else ""
                joining = group.trigger(s.ts, f"{address} rejoined{after}")
            else:
                joining = group.trigger(s.ts, f"{address} joined")
            if member_id:  # (before KIP-1082 the coordinator names new members: nothing to settle by)
                group.member(member_id).rejoining = joining
        elif epoch in LEAVING_EPOCHS:
            if member_id:
                group.member(member_id).left_at = s.ts
                group.current.pop(member_id, None)
            group.trigger(s.ts, f"{who} left (heartbeat at epoch {epoch})")
        subscription = request.get("subscribed_topic_names")
        if member_id and subscription is not None:
            info = group.member(member_id)
            if info.subscription is not None and sorted(subscription) != info.subscription:
                group.trigger(s.ts, f"{who} changed its subscription to {', '.join(sorted(subscription))}")
            info.subscription = sorted(subscription)

    def _heartbeat_v2_response(self, group: Group, s: Seen, request: dict, response: dict) -> None:
        code = response.get("error_code", 0)
        asked_by = request.get("member_id") or ""
        if code:
            name = error_name(code)
            group.pending.errors[name] += 1
            if asked_by:
                info = group.member(asked_by)
                info.errors[name] += 1
                info.errors_in = group.pending
                if code == UNKNOWN_MEMBER_ID:
                    self._removed(group, info, s.ts)
            return
        if request.get("member_epoch") in LEAVING_EPOCHS:
            return
        member_id = response.get("member_id") or asked_by
        epoch = response.get("member_epoch")
        if not member_id or epoch is None or epoch < 0:
            return
        info = group.member(member_id)
        info.client_id, info.host, info.ip, info.last_heard = s.client_id, endpoint_text(s.client), s.client[0], s.ts
        info.instance_id = request.get("instance_id") or info.instance_id
        info.answered_at = s.ts
        rejoining, info.rejoining = info.rejoining, None
        errors, info.errors = info.errors if info.errors_in is group.pending else Counter(), Counter()
        group.current[member_id] = None
        changed = response.get("assignment") is not None
        if changed:
            info.assignment = _epoch_assignment(response["assignment"])
        gen = group.latest
        if gen is None or epoch > gen.generation:
            gen = group.form(epoch, PROTOCOLS[s.api_key], s.ts)
            gen.assignor = group.server_assignor
            for mid in group.current:
                known = group.member(mid)
                gen.members[mid], gen.subscriptions[mid] = known.assignment, known.subscription
                gen.hosts[mid] = known.host
        elif epoch == gen.generation and rejoining is not None and rejoining in group.pending.triggers:
            # Given its place back at the group's epoch: its rejoining started no rebalance.
            group.pending.triggers.remove(rejoining)
            gen.events.append(rejoining)
            group.pending.errors.subtract(errors)
            group.pending.errors = +group.pending.errors  # (names counted down to nothing go)
            gen.errors.update(errors)
        if epoch == gen.generation:
            if changed or member_id not in gen.synced:
                gen.synced[member_id] = s.ts  # given the epoch, or at it the partitions it waited for
            gen.members[member_id] = info.assignment
            gen.subscriptions[member_id] = info.subscription
            gen.hosts[member_id] = info.host

    def _removed(self, group: Group, info: MemberInfo, ts: float) -> None:
        """A member the coordinator does not know: it was removed (its session or rebalance timed out) before
        the first epoch it did not reach, and is a member of neither that one nor any after."""
        if info.member_id not in group.current:
            return  # out already (it left, or was told before)
        del group.current[info.member_id]
        reached = [gen for gen in group.generations if info.member_id in gen.synced]
        after = group.generations[group.generations.index(reached[-1]) + 1:] if reached else []
        answered = f"last answered {clock(info.answered_at)}" if info.answered_at is not None else "never answered"
        text = f"{info.label()} dropped out without leaving ({answered}, then UNKNOWN_MEMBER_ID)"
        for gen in after:
            gen.members.pop(info.member_id, None)
            gen.subscriptions.pop(info.member_id, None)
            gen.hosts.pop(info.member_id, None)
        if after:
            after[0].dropped.append(Trigger(info.answered_at if info.answered_at is not None else after[0].formed,
                                            text, True))
        else:
            group.trigger(ts, text)

    # --- what other analyses ask -----------------------------------------------------------------

    def owners(self) -> Owners:
        """The index that says which group a consumer's fetch is for (Owners.owner), as the capture stands now."""
        if len(self.topic_names.by_id) != self._named:  # an id named since: assignments by id read anew
            self._named = len(self.topic_names.by_id)
            self._changed.update(self.groups)
        if self._changed:
            for group_id in self._changed:
                self._index(group_id)
            self._changed.clear()
        return self._owners

    def _index(self, group_id: str) -> None:
        """Remake a group's keys in the owners' index: its latest generation's members (client id, ip) and the
        partitions assigned to each."""
        owner_keys, member_keys = self._indexed.pop(group_id, ((), ()))
        for keys, index in ((owner_keys, self._owners.by_partition), (member_keys, self._owners.by_member)):
            for key in keys:
                index[key].discard(group_id)
                if not index[key]:
                    del index[key]
        group = self.groups[group_id]
        gen = group.latest
        owner_keys, member_keys = set(), set()
        for member_id, assignment in (gen.members.items() if gen is not None else ()):
            info = group.members.get(member_id)
            if info is None or info.ip is None:
                continue
            who = (info.client_id, info.ip)
            member_keys.add(who)
            for name, numbers in (named(assignment, self.topic_names.by_id) or {}).items():
                owner_keys.update((name, number, *who) for number in numbers)
        for keys, index in ((owner_keys, self._owners.by_partition), (member_keys, self._owners.by_member)):
            for key in keys:
                index.setdefault(key, set()).add(group_id)
        self._indexed[group_id] = (owner_keys, member_keys)

    def to_json(self) -> list[dict]:
        return [group_json(group, self.topic_names.by_id) for _, group in sorted(self.groups.items())]


def _epoch_assignment(assignment: dict) -> Assignment:
    """A heartbeat's assignment: partitions by topic id (named when shown: see `named`)."""
    out: Assignment = {}
    for entry in assignment.get("topic_partitions") or ():
        out.setdefault(entry.get("topic_id"), []).extend(entry.get("partitions") or ())
    return {topic_id: sorted(partitions) for topic_id, partitions in sorted(out.items())}


def named(assignment: Assignment | None, by_id: dict[str, str]) -> Assignment | None:
    """The assignment with its topic ids named (those the capture names), by topic name."""
    if assignment is None or not any(topic in by_id for topic in assignment):
        return assignment  # (classic assignments name their topics)
    out: Assignment = {}
    for topic, partitions in assignment.items():
        out.setdefault(by_id.get(topic, topic), []).extend(partitions)
    return {topic: sorted(set(partitions)) for topic, partitions in sorted(out.items())}


def _subscription(request: dict) -> list[str] | None:
    """The topics a JoinGroup request subscribes to (its first protocol's: all carry the same topics)."""
    for protocol in request.get("protocols") or ():
        topics = _topics_of(protocol.get("metadata"))
        if topics is not None:
            return topics
    return None


def _topics_of(metadata) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (None when the bytes are not one)."""
    if isinstance(metadata, dict) and isinstance(metadata.get("topics"), list):
        return sorted(metadata["topics"])
    return None


def _assignment_of(assignment) -> Assignment | None:
    """The partitions of a ConsumerProtocolAssignment by topic (None when the bytes are not one)."""
    if not isinstance(assignment, dict) or not isinstance(assignment.get("assigned_partitions"), list):
        return None
    out: Assignment = {}
    for entry in assignment["assigned_partitions"]:
        out.setdefault(entry["topic"], []).extend(entry["partitions"])
    return {topic: sorted(partitions) for topic, partitions in sorted(out.items())}


def clock(ts: float) -> str:
    """A capture time as HH:MM:SS.mmm (UTC), as the one-line view shows it."""
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


_REQUESTS = {
    JOIN_GROUP: GroupTracker._join_request, SYNC_GROUP: GroupTracker._sync_request,
    HEARTBEAT: GroupTracker._heartbeat_request, LEAVE_GROUP: GroupTracker._leave_request,
    OFFSET_COMMIT: GroupTracker._commit_request, CONSUMER_GROUP_HEARTBEAT: GroupTracker._heartbeat_v2_request,
    SHARE_GROUP_HEARTBEAT: GroupTracker._heartbeat_v2_request,
}
_RESPONSES = {
    JOIN_GROUP: GroupTracker._join_response, SYNC_GROUP: GroupTracker._sync_response,
    HEARTBEAT: GroupTracker._answered, LEAVE_GROUP: GroupTracker._answered, OFFSET_COMMIT: GroupTracker._answered,
    CONSUMER_GROUP_HEARTBEAT: GroupTracker._heartbeat_v2_response,
    SHARE_GROUP_HEARTBEAT: GroupTracker._heartbeat_v2_response,
}


# --- results ----------------------------------------------------------------------------------------

def causes(gen: Generation) -> list[Trigger]:
    """What started the rebalance that formed `gen`, in time order: membership and subscription changes, or
    failing those, what clients said."""
    found = sorted([t for t in gen.rebalance.triggers if t.primary] + gen.dropped, key=lambda t: t.ts)
    return found or sorted((t for t in gen.rebalance.triggers if not t.primary), key=lambda t: t.ts)


def started(gen: Generation) -> float:
    """When the rebalance began: its first trigger or JoinGroup, else when the generation formed."""
    times = [t.ts for t in gen.rebalance.triggers] + [gen.rebalance.first_join or gen.formed, gen.formed]
    return min(times)


def took_ms(gen: Generation) -> float | None:
    """First JoinGroup (classic) or first trigger (epochs) to the last member given its assignment."""
    completed = gen.completed
    if completed is None:
        return None
    begin = gen.rebalance.first_join if gen.rebalance.first_join is not None else started(gen)
    return round((completed - begin) * 1000, 3)


def member_json(group: Group, member_id: str, assignment: Assignment | None, gen: Generation,
                by_id: dict[str, str]) -> dict:
    info = group.member(member_id)
    return {"member_id": member_id, "client_id": info.client_id, "host": gen.hosts.get(member_id, info.host),
            "instance_id": info.instance_id,
            "leader": member_id == gen.leader if gen.protocol == "classic" else None,
            "subscription": gen.subscriptions.get(member_id), "assignment": named(assignment, by_id),
            "assigned_at": gen.synced.get(member_id)}


def generation_json(group: Group, gen: Generation, by_id: dict[str, str]) -> dict:
    errors = gen.rebalance.errors + gen.errors
    return {
        "generation": gen.generation, "protocol": gen.protocol, "protocol_type": gen.protocol_type,
        "assignor": gen.assignor, "started": started(gen), "first_join": gen.rebalance.first_join,
        "formed": gen.formed, "completed": gen.completed, "took_ms": took_ms(gen),
        "causes": [t.text for t in causes(gen)], "errors": dict(sorted(errors.items())),
        "events": [t.text for t in gen.events],
        "members": [member_json(group, mid, assignment, gen, by_id) for mid, assignment in gen.members.items()],
    }


def group_json(group: Group, by_id: dict[str, str]) -> dict:
    pending = group.pending
    unfinished = None
    if pending.triggers or pending.errors:
        unfinished = {"started": min((t.ts for t in pending.triggers), default=None),
                      "causes": [t.text for t in sorted(pending.triggers, key=lambda t: t.ts)],
                      "errors": dict(sorted(pending.errors.items()))}
    return {"group_id": group.group_id, "state": group.state(),
            "generations": [generation_json(group, gen, by_id) for gen in group.generations],
            "after_last_generation": unfinished}

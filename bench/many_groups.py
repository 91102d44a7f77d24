"""How the analyses scale with the number of consumer groups: `lag --json`, `groups --json` and `decode --stats` on
captures of N KIP-848 consumer groups (one member each, its own client and host), each member heartbeating six
times (a new assignment each time) and fetching its three partitions after each rebalance.

The captures are built with the group tests' encoder helpers (tests/test_group_epochs.py): what the analyses do
per fetch (which group it counts towards: GroupTracker.owner) once cost a pass over every group after every
rebalance, quadratic in N (1,000 groups: 17.8 s). Prints seconds per command and N; the time per group should
stay flat as N doubles.

    python bench/many_groups.py [--groups 250 500 1000 2000] [--runs 3] [--kafkasniff CMD]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from pcapkit import merged, write_pcap  # noqa: E402  (the tests' capture helpers)
from test_group_epochs import Client, ConsumerMember, fetch  # noqa: E402

TOPIC_ID = "6f1d7b3c-2a4e-4c8f-9b0d-5e7a1c3f9d21"
REBALANCES = 5
COMMANDS = (["lag", "--json"], ["groups", "--json"], ["decode", "--stats"])


def many_groups_capture(path: Path, groups: int) -> Path:
    members = []
    for g in range(groups):
        client = Client(f"app-{g}", (f"10.{g // 62500}.{g // 250 % 250}.{g % 250 + 1}", 50001), g * 0.01)
        member = ConsumerMember(client, uuid.UUID(int=g).hex[:22], f"group-{g}")
        member.heartbeat(g * 0.01, 0, 1, {TOPIC_ID: [0, 1, 2]}, full=True)
        members.append((client, member))
    for r in range(REBALANCES):
        for g, (client, member) in enumerate(members):
            at = 10 + r * 10 + g * 0.01
            member.heartbeat(at, r + 1, r + 2, {TOPIC_ID: [0, 1, 2]})
            fetch(client, at + 0.005, TOPIC_ID, {0: r, 1: r, 2: r}, 100)
    return write_pcap(path, merged(*[client.close(100) for client, _ in members]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kafkasniff", default=f"{sys.executable} -m kafkasniff")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for groups in args.groups:
            capture = many_groups_capture(Path(tmp) / f"groups-{groups}.pcap", groups)
            cells = []
            for command in COMMANDS:
                times = []
                for _ in range(args.runs):
                    started = time.monotonic()
                    subprocess.run([*shlex.split(args.kafkasniff), *command, str(capture)], check=True,
                                   stdout=subprocess.DEVNULL)
                    times.append(time.monotonic() - started)
                best = min(times)
                cells.append(f"{' '.join(command)} {best:.2f} s ({best / groups * 1000:.2f} ms a group)")
            print(f"{groups} groups: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()

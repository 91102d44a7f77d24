"""What decrypting TLS costs: `kafkasniff decode` of a TLS capture with its key log against the same Kafka
traffic in plaintext.

The pair comes from `bench/record_records_heavy.py OUT --tls`: OUT is the clients' TLS leg (socat's TLS
listener), OUT.plain.pcap socat's plaintext leg to the broker, captured at the same time, so both carry the
same Kafka messages; OUT.keys is the clients' key log. Each view is run --runs times, alternating plaintext and
TLS, output to /dev/null (decode_bench.py's Timings: wall, CPU with the workers', memory):

    line:  decode -j 1 F           json:  decode --json -j 1 F       verbose: decode -V F
           decode -j 3 F                  decode --json -j 2 F

(-j 3 and -j 2: the workers decode would start on 2 cores for a capture of 50,000 packets or more; a capture of
big messages like this one, 3,700 packets, decodes in one process by default.)

Reported: every run, the medians and TLS over plaintext (wall and CPU); target: at most 1.30 (issue 15).
Before timing, both are decoded once with --stats --json to check that they hold the same messages.
Seconds swing on a shared machine: --instructions instead counts the instructions of each one-process
view under valgrind's callgrind (bench/instructions.py), the same count on every run.

    python bench/record_records_heavy.py /tmp/rh_tls.pcap --tls --rounds 4
    python bench/tls_bench.py /tmp/rh_tls.pcap [--runs 5] [--instructions]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_bench import Timings, alternate, kafkasniff_command, show  # noqa: E402
from instructions import instructions  # noqa: E402

TARGET = 1.30
VIEWS = (("line -j 1", ["-j", "1"]), ("line -j 3", ["-j", "3"]), ("json -j 1", ["--json", "-j", "1"]),
         ("json -j 2", ["--json", "-j", "2"]), ("-V", ["-V"]))


def stats(ours: list[str], capture: Path, keys: list[str]) -> dict:
    done = subprocess.run([*ours, "decode", "--stats", "--json", *keys, str(capture)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path, help="the TLS capture (OUT of record_records_heavy.py --tls)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kafkasniff", help="command to run instead of this environment's kafkasniff")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions (callgrind, one process) instead of timing")
    args = parser.parse_args()
    ours = kafkasniff_command(args.kafkasniff)
    tls, plain = args.capture, Path(f"{args.capture}.plain.pcap")
    keys = ["--tls-keylog", f"{args.capture}.keys"]

    plain_stats, tls_stats = stats(ours, plain, []), stats(ours, tls, keys)
    same = {k: plain_stats["bytes"][k] == tls_stats["bytes"][k] for k in ("messages", "sasl_tokens", "skipped")}
    print(f"plaintext {plain.stat().st_size:,} bytes, TLS {tls.stat().st_size:,} bytes; bytes in messages "
          f"{plain_stats['bytes']['messages']:,} vs {tls_stats['bytes']['messages']:,}; TLS bytes around them "
          f"{tls_stats['bytes']['tls']:,}")
    if not all(same.values()):
        raise SystemExit(f"the two captures do not decode to the same messages: {same}")

    if args.instructions:
        for label, options in VIEWS:
            if options[-1:] != ["1"] and "-V" not in options:
                continue  # workers: instructions say how much work there is, not how it shares out
            counted = [instructions([*ours, "decode", *options, *extra, str(path)])
                       for path, extra in ((plain, []), (tls, keys))]
            print(f"{label:<10} instructions: plaintext {counted[0]:,}, TLS {counted[1]:,}; TLS / plaintext "
                  f"{counted[1] / counted[0]:.2f} ({'meets' if counted[1] / counted[0] <= TARGET else 'misses'} "
                  f"the {TARGET:.2f} target)", flush=True)
        return
    rows, verdicts = [], []
    for label, options in VIEWS:
        pair = (Timings(f"plaintext {label}", [*ours, "decode", *options, str(plain)]),
                Timings(f"TLS       {label}", [*ours, "decode", *options, *keys, str(tls)]))
        alternate(pair, args.runs)
        rows += pair
        wall, cpu = pair[1].median / pair[0].median, pair[1].median_cpu / pair[0].median_cpu
        verdicts.append(f"{label:<10} TLS / plaintext: wall {wall:.2f}, cpu {cpu:.2f} "
                        f"({'meets' if wall <= TARGET else 'misses'} the {TARGET:.2f} target)")
    show(rows, None)
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()

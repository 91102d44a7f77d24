"""A fuzz campaign against the decoder for a given number of minutes: counts, and the inputs that went wrong.

    .venv/bin/python tools/fuzz.py --minutes 30 --out fuzz-out            # the package as built
    .venv/bin/python tools/fuzz.py --minutes 30 --out fuzz-out --sanitized  # compiled modules under ASan/UBSan

Cases, numbered, each made from (seed, number) alone so that any can be made again:

- frame: a frame of the recorded captures (requests and responses), mutated, then decoded skimmed and in full
  (summary, Field trees, JSON, -V text); one response in 16 is also inferred as if its request was missing;
- batch: a record batch of each codec (none, gzip, snappy, lz4, zstd, and legacy messages), mutated, read as
  records (Fields and JSON);
- explain: an xxd or `hexdump -C` dump of a frame, damaged as text, read and explained as `explain` does;
- capture: a recorded capture, damaged (bytes changed, cut, pieces dropped or repeated), decoded by
  `kafkasniff decode` in every view, each a process of its own with a time limit (one case in CAPTURE_EVERY);
  every view also on two workers, whose output must be byte for byte one process's
  (a difference counts as an exception).

The cases run in a worker process that reports each case before starting it. A case whose work takes more than
HANG_SECONDS of processor time (or STARVED_SECONDS on the clock: on a busy machine processor time comes slowly,
and the campaign runs niced) is a hang: the worker is stopped, the case saved and counted, and a new worker goes
on after it. A
Python exception is counted and saved by the worker; a worker that dies (a crash, or a sanitizer's report under
--sanitized: any report ends the process) is counted with the case it was running, its last stderr kept.
The summary (also written to OUT/summary.json): cases per kind, exceptions, hangs, crashes, sanitizer reports,
and peak resident memory: of the workers, with the case during which it was reached, and of the decode processes,
each measuring its own (a process started by another starts out with that one's peak as its own in getrusage),
with the case and view. Under --sanitized, ASan holds freed memory back to catch its use after free: 32 MB of it
(ASAN_QUARANTINE_MB), not its default of 256 MB, so that the peak measures the decoder more than the quarantine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPTURES = REPO / "captures"
HANG_SECONDS = 20.0       # a case (a capture case: each of its views) taking more processor time is a hang
STARVED_SECONDS = 600.0   # and one taking this long on the clock: on a busy machine, processor time comes slowly
CAPTURE_EVERY = 400       # one case in this many is a damaged capture (they cost seconds, the others milliseconds)
FRAME_BYTES_MAX = 1 << 16  # frames of the captures kept as seeds: up to this size
VIEWS = {"line": [], "json": ["--json"], "tree": ["-V"], "hex": ["--hex"], "stats": ["--stats"]}
# Views decoded again on two workers, whose output must be byte for byte that of one process (differential)
ON_WORKERS = ("line", "json", "tree", "hex", "stats")
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")
SANITIZER_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
ASAN_QUARANTINE_MB = 32
# `kafkasniff decode` that says its own peak resident memory on stderr as it exits (VmHWM: that of the memory it
# mapped since it started, not its parent's)
DECODE = """import atexit, sys
def say_peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("fuzz-peak-kb " + line.split()[1] + "\\n")
atexit.register(say_peak)
from kafkasniff.cli import main
main(["decode", *sys.argv[1:]], prog_name="kafkasniff")
"""
PEAK_MARK = "fuzz-peak-kb "


# --- seeds --------------------------------------------------------------------------------------------------------

@cache
def seed_frames() -> list[tuple[str, int | None, int | None, bytes]]:
    """(kind, API key, version, payload) of every message of the recorded captures up to FRAME_BYTES_MAX bytes."""
    from kafkasniff.capture.files import open_capture
    from kafkasniff.stream.analyzer import Analyzer
    from kafkasniff.stream.session import MessageEvent

    frames = []
    for path in sorted(CAPTURES.glob("*.pcap")):
        with open_capture(path) as reader:
            analyzer = Analyzer()
            events = [*analyzer.run(reader.segments()), *analyzer.finish()]
        for ev in events:
            if type(ev) is MessageEvent and ev.message.api_key is not None and len(ev.payload) <= FRAME_BYTES_MAX:
                frames.append((ev.message.kind, ev.message.api_key, ev.message.api_version, ev.payload))
    return frames


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def seed_batch(rng: random.Random) -> bytes:
    from kafkasniff.protocol.records_encoder import Record, encode_message, encode_record_batch

    records = [Record(key=rng.randbytes(rng.randrange(0, 12)) if rng.random() < 0.7 else None,
                      value=rng.randbytes(rng.randrange(0, 300)), headers=[("h", rng.randbytes(3))] * rng.randrange(3))
               for _ in range(rng.randrange(1, 20))]
    codec = rng.choice(CODECS + ("legacy",))
    if codec == "legacy":
        return b"".join(encode_message(magic=rng.randrange(2), value=r.value, key=r.key, timestamp=0)
                        for r in records)
    return encode_record_batch(records, codec=codec, base_offset=rng.randrange(1 << 20),
                               is_transactional=rng.random() < 0.2, xerial_snappy=rng.random() < 0.5)


# --- mutations ----------------------------------------------------------------------------------------------------

INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
               b"\x80\x00\x00\x00", b"\x00\x00\x00\x01", b"\xff\xff", b"\x7f\xff", b"\x00\x10\x00\x00")


def mutated(data: bytes, rng: random.Random, rounds: int = 4) -> bytes:
    """Bytes changed, interesting values written, pieces cut, dropped, repeated or moved."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, rounds + 1)):
        if not out:
            out += rng.randbytes(rng.randrange(1, 16))
            continue
        at = rng.randrange(len(out))
        what = rng.randrange(7)
        if what == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif what == 1:
            out[at] = rng.randrange(256)
        elif what == 2:
            value = rng.choice(INTERESTING)
            out[at:at + len(value)] = value
        elif what == 3:
            del out[rng.randrange(at, len(out) + 1):]
        elif what == 4:
            del out[at:at + rng.randrange(1, 64)]
        elif what == 5:
            piece = out[at:at + rng.randrange(1, 64)]
            out[at:at] = piece * rng.randrange(1, 4)
        else:
            source = rng.randrange(len(out))
            out[at:at] = out[source:source + rng.randrange(1, 32)]
    return bytes(out)


def dump_text(data: bytes, rng: random.Random) -> str:
    """data as xxd or hexdump -C would show it."""
    lines = []
    for at in range(0, len(data), 16):
        row = data[at:at + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        if rng.random() < 0.5:
            groups = " ".join(row[i:i + 2].hex() for i in range(0, len(row), 2))
            lines.append(f"{at:08x}: {groups:<39}  {text}")
        else:
            cells = " ".join(f"{b:02x}" for b in row[:8]) + "  " + " ".join(f"{b:02x}" for b in row[8:])
            lines.append(f"{at:08x}  {cells:<48}  |{text}|")
    lines.append(f"{len(data):08x}")
    return "\n".join(lines) + "\n"


def damaged_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randrange(1, 4)):
        if not lines:
            break
        at = rng.randrange(len(lines))
        what = rng.randrange(5)
        if what == 0:
            lines.insert(at, "*")
        elif what == 1:
            lines[at] = f"{rng.choice((0, 0x10, 0xfffffff0, 1 << 40, rng.randrange(1 << 32))):08x}: " + lines[at][10:]
        elif what == 2:
            lines[at:at + 1] = [lines[at]] * rng.randrange(2, 6)
        elif what == 3:
            del lines[at]
        else:
            line = list(lines[at])
            if line:
                line[rng.randrange(len(line))] = rng.choice("0123456789abcdefgxz*:| \t")
            lines[at] = "".join(line)
    return "\n".join(lines) + "\n"


# --- cases --------------------------------------------------------------------------------------------------------

def case_kind(number: int) -> str:
    return "capture" if number % CAPTURE_EVERY == CAPTURE_EVERY - 1 else ("frame", "batch", "explain")[number % 3]


def case_input(seed: int, number: int) -> tuple[str, dict, bytes]:
    """The case's kind, what it is about, and its input bytes (a dump's text for explain)."""
    rng = random.Random(f"{seed}:{number}")
    kind = case_kind(number)
    if kind == "frame":
        frame_kind, key, version, payload = rng.choice(seed_frames())
        infer = frame_kind == "response" and rng.randrange(16) == 0
        return kind, {"kind": frame_kind, "api_key": key, "api_version": version, "infer": infer}, mutated(payload, rng)
    if kind == "batch":
        return kind, {}, mutated(seed_batch(rng), rng)
    if kind == "explain":
        _, _, _, payload = rng.choice(seed_frames())
        payload = payload[:4096]
        framed = len(payload).to_bytes(4, "big") + payload if rng.random() < 0.5 else payload
        return kind, {}, damaged_text(dump_text(mutated(framed, rng, 2), rng), rng).encode()
    capture = rng.choice(sorted(CAPTURES.glob("*.pcap")))
    return kind, {"capture": capture.name}, mutated(capture.read_bytes(), rng, 12)


def run_frame(about: dict, data: bytes) -> None:
    from kafkasniff.protocol.identify import infer_response
    from kafkasniff.protocol.messages import (decode_request, decode_response_for_request, field_trees, json_body,
                                              record_columns, tree_text)

    for skim in (True, False):
        if about["kind"] == "request":
            msg = decode_request(data, skim=skim)
        else:
            msg = decode_response_for_request(data, about["api_key"], about["api_version"], skim=skim)
        assert msg.end == len(data) and (msg.malformed is None or 0 <= msg.malformed.offset <= len(data))
    field_trees(msg, data, record_limit=1000)
    json_body(msg, data)
    tree_text(msg, data, 64, False, True)
    record_columns(msg, data, lambda *chunk: None, 1000)
    if about["infer"]:
        infer_response(data)


def run_batch(data: bytes) -> None:
    from kafkasniff.protocol.walker import records_fields, records_json

    records_fields(data, 0, len(data), record_limit=1000)
    records_json(data, 0, len(data))


class Sink:
    """Output written and dropped, as to a pipe, but for the first JSON_KEPT characters."""

    JSON_KEPT = 1 << 20

    def __init__(self):
        self.kept: list[str] = []
        self.size = 0

    def write(self, text: str) -> None:
        if self.size < self.JSON_KEPT:
            self.kept.append(text)
        self.size += len(text)

    def flush(self) -> None:
        pass

    def json(self):
        """The document written, when it was short enough to keep (None otherwise)."""
        return json.loads("".join(self.kept)) if self.size < self.JSON_KEPT else None


def run_explain(text: bytes) -> None:
    import io

    from rich.console import Console

    from kafkasniff.cli import kafka_bytes
    from kafkasniff.protocol.identify import identify
    from kafkasniff.render.explain import print_explanation, write_explanation_json
    from kafkasniff.render.hexinput import parse_hex_blocks, read_dump

    try:
        blocks = parse_hex_blocks(read_dump(io.StringIO(text.decode())))
    except ValueError:
        return  # explain's one-line error: what bad input should get
    data, _ = kafka_bytes(blocks) if blocks else (b"", None)
    del blocks  # as explain does: their bytes are in data
    if data:
        ident = identify(data)
        document = Sink()
        write_explanation_json(document, ident, data)
        document.json()  # it parses
        print_explanation(Console(file=Sink(), width=200), ident, data, 64)


def processor_seconds(pid: int) -> float:
    """Processor time a running process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime


def processor_seconds_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_capture(data: bytes, folder: Path) -> tuple[list[str], dict[str, int]]:
    """Problems of `kafkasniff decode` on the capture, in each view (a hang raises TimeoutExpired), and the peak
    resident memory (KB) of each view's process."""
    path = folder / "capture.pcap"
    path.write_bytes(data)
    problems, peaks = [], {}
    one_process = {}
    runs = [(view, "1", options) for view, options in VIEWS.items()]
    runs += [(f"{view} on workers", "2", VIEWS[view]) for view in ON_WORKERS]
    for view, jobs, options in runs:
        # run from the scratch folder: `-c` puts the working directory first on the path, and the package to
        # test is the one this process imports (under --sanitized, the sanitized build)
        before = processor_seconds_of_children()
        done = subprocess.run([sys.executable, "-c", DECODE, "-j", jobs, *options, str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=STARVED_SECONDS, cwd=folder)
        if processor_seconds_of_children() - before > HANG_SECONDS:
            raise subprocess.TimeoutExpired(done.args, HANG_SECONDS)
        stderr = done.stderr.decode(errors="replace")
        said = [line for line in stderr.splitlines() if line.startswith(PEAK_MARK)]
        if said:
            peaks[view] = int(said[-1][len(PEAK_MARK):])
            stderr = "".join(line + "\n" for line in stderr.splitlines() if not line.startswith(PEAK_MARK))
        if any(mark in stderr for mark in SANITIZER_MARKS):
            problems.append(f"sanitizer: {view}: {stderr[-3000:]}")
        elif done.returncode not in (0, 2) or "Traceback" in stderr:
            problems.append(f"exception: {view}: exit {done.returncode}: {stderr[-3000:]}")
        elif jobs == "1":
            one_process[view] = done.stdout
        elif view.removesuffix(" on workers") in one_process and \
                done.stdout != one_process[view.removesuffix(" on workers")]:
            problems.append(f"exception: {view}: output differs from one process's")
    return problems, peaks


def worker(seed: int, first: int, until: float, out: Path) -> None:
    """Run cases from `first` until the time `until`, saying each before it starts: 'case N' on stdout; and when
    a case raises the worker's peak resident memory, or a decode process's is the highest yet, 'peak worker KB'
    or 'peak decode KB VIEW' (the case is the one said last)."""
    import warnings

    warnings.simplefilter("ignore")
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-capture-"))
    number = first
    worker_peak = decode_peak = 0
    try:
        while time.time() < until:
            kind, about, data = case_input(seed, number)
            print(f"case {number}", flush=True)
            try:
                if kind == "frame":
                    run_frame(about, data)
                elif kind == "batch":
                    run_batch(data)
                elif kind == "explain":
                    run_explain(data)
                else:
                    problems, peaks = run_capture(data, scratch)
                    for problem in problems:
                        print(f"problem {number} {json.dumps(problem)}", flush=True)
                    for view, peak in peaks.items():
                        if peak > decode_peak:
                            decode_peak = peak
                            print(f"peak decode {peak} {view}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"hang {number}", flush=True)
            except Exception:
                print(f"problem {number} {json.dumps('exception: ' + traceback.format_exc()[-3000:])}", flush=True)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            if peak > worker_peak:
                worker_peak = peak
                print(f"peak worker {peak}", flush=True)
            number += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- the campaign -------------------------------------------------------------------------------------------------

def sanitized_environment(folder: Path) -> dict[str, str]:
    """The package copied to folder with its compiled modules built under ASan/UBSan, and the environment that
    runs it (any report ends the process)."""
    def runtime(name: str) -> str:
        return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()

    for part in ("kafkasniff", "setup.py", "pyproject.toml"):
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, folder / part, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy(source, folder / part)
    flags = {**os.environ, "CFLAGS": SANITIZER_FLAGS, "LDFLAGS": SANITIZER_FLAGS}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=folder, env=flags, check=True,
                   capture_output=True)
    return {**os.environ, "PYTHONPATH": str(folder), "LD_PRELOAD": runtime("libasan.so"),
            "ASAN_OPTIONS": f"detect_leaks=0:abort_on_error=1:quarantine_size_mb={ASAN_QUARANTINE_MB}",
            "UBSAN_OPTIONS": "print_stacktrace=1"}


def save(out: Path, seed: int, number: int, what: str, detail: str) -> None:
    kind, about, data = case_input(seed, number)
    folder = out / f"{what}-{kind}-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("input.txt" if kind == "explain" else "input.bin")).write_bytes(data)
    (folder / "case.json").write_text(json.dumps({"seed": seed, "case": number, "kind": kind, **about,
                                                  "what": what, "detail": detail}, indent=1) + "\n")


def reaped(child: subprocess.Popen) -> int:
    """Wait for a worker to end; its peak resident memory (KB), and the decode processes' it waited for, whose
    own start with the worker's. Not getrusage of all children: under --sanitized they include the compiler."""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss


def campaign(minutes: float, out: Path, seed: int, env: dict[str, str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    until = time.time() + minutes * 60
    counts = {"cases": 0, **{f"{kind} cases": 0 for kind in ("frame", "batch", "explain", "capture")},
              "exceptions": 0, "hangs": 0, "crashes": 0, "sanitizer reports": 0}
    peaks = {"worker": (0, None), "decode": (0, None)}  # KB, and the case: {"case", "kind"} or {"case", "view"}
    started = time.time()
    number = 0
    running = case_cpu = case_started = None
    workers_peak = 0  # KB: what each worker used, as getrusage says when it ends (a worker stopped says no more)
    while time.time() < until:
        worker_stderr = open(out / "worker-stderr.txt", "w+")  # a file: a pipe nobody reads could fill and block
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(seed), str(number),
                                  str(until), str(out)], stdout=subprocess.PIPE, stderr=worker_stderr, env=env,
                                 cwd=REPO, text=True)
        running = None
        while True:
            ready, _, _ = select.select([child.stdout], [], [], 5)
            # A hang: a case working in the worker for HANG_SECONDS of processor time (a capture case's views are
            # timed by the worker), or no word for longer than any case may take on the clock.
            if not ready and running is not None and (
                    case_kind(running) != "capture" and processor_seconds(child.pid) - case_cpu > HANG_SECONDS or
                    time.monotonic() - case_started > STARVED_SECONDS * (len(VIEWS) + len(ON_WORKERS) + 1)):
                child.kill()
                workers_peak = max(workers_peak, reaped(child))
                counts["hangs"] += 1
                save(out, seed, running, "hang", f"more than {HANG_SECONDS} s of processor time without an end")
                number = running + 1
                break
            if not ready:
                continue
            line = child.stdout.readline()
            if not line:
                workers_peak = max(workers_peak, reaped(child))
                worker_stderr.seek(0)
                stderr = worker_stderr.read()
                if child.returncode != 0 and running is not None:
                    what = "sanitizer" if any(mark in stderr for mark in SANITIZER_MARKS) else "crash"
                    counts["sanitizer reports" if what == "sanitizer" else "crashes"] += 1
                    save(out, seed, running, what, f"exit {child.returncode}: {stderr[-4000:]}")
                    number = running + 1
                break
            word, *rest = line.split(" ", 2)
            if word == "case":
                running = int(rest[0])
                case_cpu, case_started = processor_seconds(child.pid), time.monotonic()
                counts["cases"] += 1
                counts[f"{case_kind(running)} cases"] += 1
            elif word == "problem":
                detail = json.loads(rest[1])
                what = "sanitizer" if detail.startswith("sanitizer") else "exception"
                counts["sanitizer reports" if what == "sanitizer" else "exceptions"] += 1
                save(out, seed, int(rest[0]), what, detail)
            elif word == "hang":
                counts["hangs"] += 1
                save(out, seed, int(rest[0]), "hang", f"a view took more than {HANG_SECONDS} s of processor time")
            elif word == "peak":
                kb, *view = rest[1].split()
                if int(kb) > peaks[rest[0]][0]:
                    peaks[rest[0]] = (int(kb), {"case": running, **({"view": view[0]} if view else
                                                                     {"kind": case_kind(running)})})
        worker_stderr.close()
    summary = {**counts, "minutes": round((time.time() - started) / 60, 1), "seed": seed,
               **{f"peak_{which}_mb": round(kb / 1024, 1) for which, (kb, _) in peaks.items()},
               **{f"peak_{which}_case": case for which, (_, case) in peaks.items()},
               "peak_process_mb": round(max(workers_peak, *(kb for kb, _ in peaks.values())) / 1024, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        seed, first, until, out = sys.argv[2:]
        worker(int(seed), int(first), float(until), Path(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where reproducers and summary.json go")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sanitized", action="store_true",
                        help="build the compiled modules under ASan/UBSan first (needs gcc with libasan)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuzz-build-") as folder:
        env = sanitized_environment(Path(folder)) if args.sanitized else dict(os.environ)
        summary = campaign(args.minutes, args.out, args.seed, env)
    print(json.dumps(summary))
    problems = summary["exceptions"] + summary["hangs"] + summary["crashes"] + summary["sanitizer reports"]
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

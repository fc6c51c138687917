"""Shared fixtures: one private Azurite per test session, and a fresh container per test.

Without the Azurite executable the tests that need it are skipped with the reason -- unless
BLOBMOUNT_REQUIRE_ALL=1 (set by CI), where a missing emulator is a failure, not a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from blobmount.testing.azurite import AzuriteServer, find_azurite


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output with lone surrogates (the tests of blob names that are not valid Unicode
    log such names) escaped, so a pytest-xdist worker can send its report as UTF-8."""
    report = yield
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report


def _require_all() -> bool:
    return os.environ.get("BLOBMOUNT_REQUIRE_ALL") == "1"


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    """A started AzuriteServer on a free loopback port; stopped at the end of the session."""
    try:
        executable = find_azurite()
    except FileNotFoundError as exc:
        if _require_all():
            pytest.fail(f"Azurite is required (BLOBMOUNT_REQUIRE_ALL=1) but missing: {exc}")
        pytest.skip(f"Azurite not installed: {exc}")
    server = AzuriteServer(executable=executable)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def container(azurite: AzuriteServer) -> Iterator[str]:
    """A new, empty container on the session's Azurite; deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:24]}"
    azurite.create_container(name)
    try:
        yield name
    finally:
        azurite.delete_container(name)


@pytest.fixture
def proxy(azurite):
    """A fault-injecting proxy in front of the session's Azurite (tests/helpers/fault_proxy.py),
    switched per test and always stopped."""
    from tests.helpers.fault_proxy import FaultProxy

    with FaultProxy(azurite.port) as p:
        yield p

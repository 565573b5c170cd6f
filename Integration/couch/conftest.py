"""Fixtures for the CouchDB HTTP API suite: the servers under test, read from the environment.

FERRY_COUCH_URL_A        base URL of the first server, ending in "/" (default http://127.0.0.1:4987/)
FERRY_COUCH_URL_B        base URL of the second server (optional)
FERRY_COUCH_DB           database name on both servers (default "ferry")
FERRY_COUCH_USER         user name on A (default "admin")
FERRY_COUCH_PASSWORD     password on A (default "admin")
FERRY_COUCH_USER_B       user name on B (default: FERRY_COUCH_USER)
FERRY_COUCH_PASSWORD_B   password on B (default: FERRY_COUCH_PASSWORD)

Without FERRY_COUCH_URL_B, tests marked `two_servers` use a second database "<db>-b" on A
when A lets us create it (Apache CouchDB does; a Ferry node serves one database), and are
deselected otherwise. The database on A is created when missing (a Ferry node answers 412).

Every test works on its own document IDs (the `uid` fixture), so the suite can run against
a database that holds other data and can run twice.
"""

import os
import uuid

import pytest

from couchhttp import CouchServer


def pytest_configure(config):
    config.addinivalue_line("markers", "two_servers: needs two databases (FERRY_COUCH_URL_B or a second database on A)")


def _env(name, default=None):
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _server_a():
    return CouchServer(
        _env("FERRY_COUCH_URL_A", "http://127.0.0.1:4987/"),
        _env("FERRY_COUCH_DB", "ferry"),
        _env("FERRY_COUCH_USER", "admin"),
        _env("FERRY_COUCH_PASSWORD", "admin"),
    )


def _ensure_db(server):
    """Creates the database when the server lets us; True when it exists afterwards."""
    # q=1: one shard, so that a CouchDB's changes come in one total order as a node's do.
    r = server.request("PUT", server.db_url, params={"q": "1"})
    if r.status_code in (201, 202, 412):
        return True
    return server.request("GET", server.db_url).status_code == 200


_B_CACHE = {}


def _server_b():
    if "b" in _B_CACHE:
        return _B_CACHE["b"]
    url_b = _env("FERRY_COUCH_URL_B")
    db = _env("FERRY_COUCH_DB", "ferry")
    if url_b:
        b = CouchServer(
            url_b, db,
            _env("FERRY_COUCH_USER_B", _env("FERRY_COUCH_USER", "admin")),
            _env("FERRY_COUCH_PASSWORD_B", _env("FERRY_COUCH_PASSWORD", "admin")),
        )
        # Given explicitly, B is never deselected: if it is unreachable, its tests fail.
        _ensure_db(b)
    else:
        a = _server_a()
        b = CouchServer(a.base, db + "-b", a.user, a.password)
        b = b if _ensure_db(b) else None
    _B_CACHE["b"] = b
    return b


def pytest_collection_modifyitems(config, items):
    needs_two = [i for i in items if i.get_closest_marker("two_servers")]
    if needs_two and _server_b() is None:
        config.hook.pytest_deselected(items=needs_two)
        items[:] = [i for i in items if not i.get_closest_marker("two_servers")]


@pytest.fixture(scope="session")
def server():
    """The first server, with its database present."""
    s = _server_a()
    if not _ensure_db(s):
        r = s.request("GET", s.db_url)
        pytest.fail(f"database {s.db} is not reachable at {s.base}: GET answered {r.status_code} {r.text[:300]}")
    return s


@pytest.fixture(scope="session")
def couch(server):
    """Alias: the server under test for single-server tests."""
    return server


@pytest.fixture(scope="session")
def server_b():
    b = _server_b()
    if b is None:
        pytest.skip("no second database available")
    return b


@pytest.fixture
def uid():
    """A prefix unique to this test, for document IDs (lower-case ASCII, sorts simply)."""
    return "t" + uuid.uuid4().hex[:12] + "-"

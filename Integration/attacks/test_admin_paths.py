"""Attacks on a real `ferry serve`'s admin listener by a local user without the admin key,
and by one dashboard session.

Each test starts its own node (ephemeral ports, a temporary data directory, no DNS-SD) from
the ferry binary in $FERRY_BINARY (default .build/debug/ferry) and asserts the refusal:

- every admin route, under every spelling of its path a client can send (`//`, a trailing
  `/`, `%2F`, `.` and `..` segments, other letter cases), answers 401 without the key: in
  particular `POST /ui/tokens/` and `POST /ui//tokens` hand out no dashboard login link;
  and the CouchDB listener's routes likewise refuse an anonymous caller under those spellings;
- one dashboard session asking for 300 live event streams (`GET /ui/events`) gets the
  per-session cap and 429 `too_many_streams` for the rest, while the admin API still answers;
  sessions together get the node's total cap; and a stream's slot comes back when its client
  drops the TCP connection.

Requests go over raw sockets, so every path reaches the node byte for byte (an HTTP library
would resolve dot segments or re-escape).
"""

import json
import os
import shutil
import socket
import struct
import tempfile
import time

import pytest

from ferry_node import Node


# The caps on live event streams (DashboardSessions.maxStreamsPerSession, .maxStreams).
STREAMS_PER_SESSION = 4
STREAMS_IN_TOTAL = 32

# Every route of the admin API (AdminAPI.router(); docs/operations.md), with captures filled
# in; the open ones (the dashboard's login pages and files) are listed apart.
GUARDED = [
    ("GET", "/"), ("GET", "/docs"), ("GET", "/docs/a/b"), ("PUT", "/docs/a/b"), ("DELETE", "/docs/a/b"),
    ("GET", "/changes"), ("GET", "/peers"), ("GET", "/replications"), ("POST", "/replications"),
    ("DELETE", "/replications/x"), ("POST", "/replications/x/pause"), ("POST", "/replications/x/resume"),
    ("POST", "/replications/x/reset"), ("GET", "/trust"), ("POST", "/trust"), ("PUT", "/trust/x"), ("DELETE", "/trust/x"),
    ("GET", "/group"), ("POST", "/group/invitations"), ("POST", "/group/join"), ("DELETE", "/group/members/x"),
    ("GET", "/metrics"), ("GET", "/blobs/x"), ("GET", "/blobs/x/state"), ("POST", "/blobs/x/fetch"), ("POST", "/blobs"),
    ("GET", "/couch/users"), ("POST", "/couch/users"), ("PUT", "/couch/users/x"), ("DELETE", "/couch/users/x"),
    ("GET", "/access"), ("PUT", "/access/rules/x"), ("DELETE", "/access/rules/x"), ("PUT", "/access/roles/x"),
    ("GET", "/access/explain"), ("GET", "/access/removed"),
    ("GET", "/ui/events"), ("POST", "/ui/tokens"),
    ("GET", "/conflicts"), ("POST", "/conflicts/resolve"), ("POST", "/find"),
]
OPEN = [("GET", "/ui/"), ("GET", "/ui/login"), ("POST", "/ui/login"), ("POST", "/ui/logout"), ("GET", "/ui/app.js"),
        ("GET", "/ui/app.css")]


@pytest.fixture
def node():
    root = tempfile.mkdtemp(prefix="ferry-attack-admin-")
    n = Node(root, "clinic")
    try:
        n.start()
        yield n
    finally:
        n.stop()
        if not os.environ.get("KEEP_IT_ROOT"):
            shutil.rmtree(root, ignore_errors=True)


def request_bytes(port, method, path, headers=None, body=None):
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def read_head(sock):
    """Reads a response's status line and headers; returns (status, headers, the bytes after them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/1.1 ") else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return status, headers, rest


def call(port, method, path, headers=None, body=None):
    """One request on its own connection (closed by the client after the answer): status, headers, body."""
    headers = dict(headers or {})
    headers["Connection"] = "close"
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request_bytes(port, method, path, headers, body))
        status, response_headers, rest = read_head(s)
        length = int(response_headers.get("content-length", ["-1"])[0])
        while length < 0 or len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    return status, response_headers, rest


def error_code(body):
    try:
        return json.loads(body).get("error")
    except ValueError:
        return None


def spellings(path):
    """The spellings of `path` a client may send: ones Hummingbird's router reads as the path
    itself (empty segments, a trailing `/`) and ones it does not (dot segments, escapes, case)."""
    s = [p for p in path.split("/") if p]
    canonical = "/" + "/".join(s)
    escaped = ["%%%02X" % ord(p[0]) + p[1:] for p in s]
    out = {
        canonical, canonical + "/", "/" + canonical, "/" + "//".join(s), "//" + "///".join(s) + "//", canonical + "//",
        "/./" + "/".join(s), "/" + "/./".join(s), canonical + "/.", canonical + "/..", "/x/../" + "/".join(s),
        "/" + "/x/../".join(s), "/" + "%2F".join(s), "/" + "%2f".join(s), "/%2F" + "/".join(s), "/" + "/".join(escaped),
        canonical.upper(), "/" + "/".join(p[:1].upper() + p[1:] for p in s), canonical + ";x",
    }
    if not s:
        out |= {"//", "///", "/.", "/..", "/%2F"}
    return sorted(out)


def test_no_spelling_of_a_guarded_admin_route_answers_without_the_key(node):
    port = node.admin_port
    # The reported attack: a keyless local user asks for a login link with a trailing or doubled slash.
    for path in ["/ui/tokens/", "/ui//tokens", "//ui/tokens", "/ui/tokens//"]:
        status, _, body = call(port, "POST", path, body=b"{}")
        assert status == 401 and b"token=" not in body, (path, status, body)
    refused = []
    for method, route in GUARDED:
        body = b"{}" if method in ("POST", "PUT") else None
        for path in spellings(route):
            status, _, answer = call(port, method, path, body=body)
            if status != 401 or error_code(answer) != "unauthorized" or b"token=" in answer:
                refused.append((method, path, status, answer[:200]))
    assert not refused, "answered without the admin key:\n" + "\n".join(map(str, refused))
    # The list above is the router's: with the key, each route is found (no "no route" 404).
    auth = {"Authorization": "Bearer " + node.key}
    for method, route in GUARDED + OPEN:
        body = b"{}" if method in ("POST", "PUT") else None
        status, _, answer = call(port, method, route, headers=auth, body=body)
        assert not (status == 404 and b"no route" in answer), (method, route, answer)
    # The open routes (the dashboard's login pages and files) are not the guard's to refuse.
    for method, route in OPEN:
        status, _, answer = call(port, method, route, body=b"" if method == "POST" else None,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"} if method == "POST" else None)
        assert error_code(answer) != "unauthorized", (method, route, status, answer[:200])


def test_no_spelling_of_a_couchdb_route_answers_an_anonymous_caller(node):
    port = node.couch_port
    status, _, body = call(port, "GET", "/", headers={"Authorization": "Bearer " + node.key})
    assert status == 200, body
    db = json.loads(call(port, "GET", "/_all_dbs", headers={"Authorization": "Bearer " + node.key})[2])[0]
    leaked = []
    for route in ["/_all_dbs", "/_uuids", "/_active_tasks", f"/{db}", f"/{db}/_all_docs", f"/{db}/_changes", f"/{db}/doc",
                  f"/{db}/_local/x", f"/{db}/_design/x", f"/{db}/doc/attachment"]:
        for path in spellings(route):
            status, _, answer = call(port, "GET", path)
            if status != 401:
                leaked.append((path, status, answer[:200]))
    assert not leaked, "answered without credentials:\n" + "\n".join(map(str, leaked))


def dashboard_session(port, key):
    """A dashboard session opened as `ferry ui`'s link does: its cookie header."""
    status, _, body = call(port, "POST", "/ui/tokens", headers={"Authorization": "Bearer " + key}, body=b"{}")
    assert status == 200, body
    status, headers, _ = call(port, "GET", json.loads(body)["path"])
    assert status == 303, headers
    cookie = next(c for c in headers["set-cookie"] if c.startswith("ferry_session="))
    return cookie.split(";", 1)[0]


def open_stream(port, cookie):
    """A live event stream held open on its own connection: (status, socket or None, the
    bytes read past the head: the first events, or a refusal's body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(request_bytes(port, "GET", "/ui/events", {"Cookie": cookie, "Accept": "text/event-stream"}))
    status, headers, rest = read_head(s)
    if status == 200:
        return status, s, rest
    length = int(headers.get("content-length", ["0"])[0])
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    s.close()
    return status, None, rest


def eventually_open(port, cookie, what):
    """Opens a stream once the node has given a slot back (it notices a closed connection at its next write)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        status, s, body = open_stream(port, cookie)
        if status == 200:
            return s
        assert status == 429 and error_code(body) == "too_many_streams", (status, body)
        time.sleep(0.2)
    raise AssertionError("no stream slot came back: " + what)


def test_event_streams_are_capped_per_session_and_in_total_and_freed_on_disconnect(node):
    port, key = node.admin_port, node.key
    auth = {"Authorization": "Bearer " + key}
    cookie = dashboard_session(port, key)
    held = []
    try:
        # The reported attack: one session asks for 300 streams.
        refusals = []
        first_events = b""
        for _ in range(300):
            status, s, body = open_stream(port, cookie)
            if s:
                held.append(s)
                first_events = first_events or body
            else:
                refusals.append((status, body))
        assert len(held) == STREAMS_PER_SESSION, len(held)
        assert all(status == 429 and error_code(body) == "too_many_streams" for status, body in refusals), refusals[:3]
        reason = json.loads(refusals[0][1])["reason"]
        assert "session" in reason and str(STREAMS_PER_SESSION) in reason, reason
        # The admin API still answers, and a stream carries events.
        assert call(port, "GET", "/", headers=auth)[0] == 200
        assert b"data: " in (first_events or held[0].recv(65536)), first_events

        # A client that drops its connection gives its slot back.
        held.pop(0).close()
        held.append(eventually_open(port, cookie, "after a client closed its connection"))
        # An abrupt drop (RST) too.
        victim = held.pop(0)
        victim.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        victim.close()
        held.append(eventually_open(port, cookie, "after a client reset its connection"))

        # Other sessions fill the node's total; the next session is refused.
        while len(held) < STREAMS_IN_TOTAL:
            other = dashboard_session(port, key)
            for _ in range(min(STREAMS_PER_SESSION, STREAMS_IN_TOTAL - len(held))):
                status, s, body = open_stream(port, other)
                assert status == 200, (len(held), status, body)
                held.append(s)
        late = dashboard_session(port, key)
        status, s, body = open_stream(port, late)
        assert status == 429 and error_code(body) == "too_many_streams", (status, body)
        assert str(STREAMS_IN_TOTAL) in json.loads(body)["reason"], body
        assert call(port, "GET", "/", headers=auth)[0] == 200
        held.pop().close()
        held.append(eventually_open(port, late, "of the node's total after a client closed its connection"))
    finally:
        for s in held:
            s.close()

"""Password, login-throttle and session attacks against real `ferry serve` processes.

Each test starts its own nodes (ephemeral ports, a temporary data directory, no DNS-SD)
from the ferry binary in $FERRY_BINARY (default .build/debug/ferry) and asserts the refusal:

- the replication listener's HTTP Basic check (`serve --password-file`) is throttled: 300
  wrong passwords in a row, then the right one, gets 429, from that address and from another;
- 100 parallel wrong CouchDB logins: at most the throttle's limit are evaluated (401), the
  rest are refused unevaluated (429), and 127.0.0.2 is refused for the same account too;
- a session cookie issued by the LAN CouchDB listener is refused on loopback and the reverse;
- the password never appears in argv: `serve --password` is refused, and a node started with
  a password file or $FERRY_PASSWORD shows no password in /proc/PID/cmdline or `ps`.
"""

import base64
import concurrent.futures
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import tempfile
import time

import pytest
import requests
import urllib3
from requests.adapters import HTTPAdapter

from ferry_node import FERRY, Node

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

PASSWORD = "Correct-Horse-7Battery"
# The throttle's defaults (docs/couchdb-api.md): 10 failures per address and minute,
# backoff of an account after 5 consecutive failures.
ADDRESS_LIMIT = 10


@pytest.fixture
def root():
    path = tempfile.mkdtemp(prefix="ferry-attack-auth-")
    nodes = []
    yield path, nodes
    for n in nodes:
        n.stop()
    if not os.environ.get("KEEP_IT_ROOT"):
        shutil.rmtree(path, ignore_errors=True)


def node(root, name):
    path, nodes = root
    n = Node(path, name)
    nodes.append(n)
    return n


def secret_file(directory, text, mode=0o600):
    path = os.path.join(directory, "password-%d" % time.monotonic_ns())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)
    return path


def host_port(url):
    rest = url.split("://", 1)[1]
    authority = rest.split("/", 1)[0]
    host, port = authority.rsplit(":", 1)
    return host, int(port)


def upgrade_status(url, user, password, source="127.0.0.1"):
    """The status of a WebSocket upgrade with Basic credentials, over raw TLS from `source`."""
    host, port = host_port(url)
    path = "/" + url.split("://", 1)[1].split("/", 1)[1]
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    with context.wrap_socket(raw, server_hostname="ferry") as tls:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        key = base64.b64encode(os.urandom(16)).decode()
        tls.sendall((
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Basic {token}\r\n\r\n").encode())
        head = b""
        while b"\r\n" not in head:
            chunk = tls.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


class SourceAdapter(HTTPAdapter):
    """Requests sent from a chosen loopback address (127.0.0.2 is as local as 127.0.0.1)."""

    def __init__(self, source):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def session_from(source):
    s = requests.Session()
    s.mount("http://", SourceAdapter(source))
    s.mount("https://", SourceAdapter(source))
    return s


def couch_user_node(root, name, lan=False):
    """A node with the CouchDB user `tablet` (and the LAN listener on 127.0.0.1 when asked)."""
    n = node(root, name)
    password_file = secret_file(root[0], PASSWORD)
    entry = n.ferry("couch-user", "tablet", "--password-file", password_file, "--iterations", "10000", data=False)
    assert entry.returncode == 0, entry.stderr
    couch = {"users": [json.loads(entry.stdout)]}
    if lan:
        couch["lan"] = {"interface": "127.0.0.1", "port": 0}
    config = os.path.join(root[0], name + ".json")
    with open(config, "w") as f:
        json.dump({"couch": couch}, f)
    n.start("--config", config)
    return n


def test_replication_listener_basic_check_is_throttled_after_300_wrong_passwords(root):
    n = node(root, "basic")
    n.start("--password-file", secret_file(root[0], "peer:" + PASSWORD))
    url = n.info["url"]
    assert upgrade_status(url, "peer", PASSWORD) == 101
    statuses = [upgrade_status(url, "peer", "guess-%d" % i) for i in range(20)]
    # The account backs off (32 s after these 10 failures): another address is refused too,
    # even with the right password.
    assert upgrade_status(url, "peer", PASSWORD, source="127.0.0.2") == 429
    statuses += [upgrade_status(url, "peer", "guess-%d" % i) for i in range(20, 300)]
    evaluated = statuses.count(401)
    assert evaluated <= ADDRESS_LIMIT, statuses
    assert statuses.count(429) >= 300 - ADDRESS_LIMIT, statuses
    # The right password now waits out the address's window.
    assert upgrade_status(url, "peer", PASSWORD) == 429


def test_ferry_sync_reads_the_listener_password_from_a_file_or_the_environment(root):
    server = node(root, "server")
    server.start("--password-file", secret_file(root[0], "peer:" + PASSWORD))
    server_id = server.ferry("id").stdout.strip()
    client = node(root, "client")
    url = server.info["url"]
    env = dict(os.environ, FERRY_PASSWORD="peer:" + PASSWORD)
    ok = client.ferry("sync", url, "--pin", server_id, "--json", env=env)
    assert ok.returncode == 0, ok.stderr
    from_file = client.ferry("sync", url, "--pin", server_id, "--password-file", secret_file(root[0], "peer:" + PASSWORD))
    assert from_file.returncode == 0, from_file.stderr
    refused = client.ferry("sync", url, "--pin", server_id, "--password", "peer:" + PASSWORD)
    assert refused.returncode == 64 and "--password-file" in refused.stderr and "FERRY_PASSWORD" in refused.stderr


def test_parallel_wrong_couch_logins_are_refused_beyond_the_limit_and_from_another_address(root):
    n = couch_user_node(root, "couch")
    base = n.info["couchURL"].rstrip("/")

    def wrong(i):
        return requests.post(base + "/_session", json={"name": "tablet", "password": "guess-%d" % i}, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=100) as pool:
        statuses = list(pool.map(wrong, range(100)))
    assert statuses.count(401) <= ADDRESS_LIMIT, statuses
    assert statuses.count(429) >= 100 - ADDRESS_LIMIT, statuses
    # Another address gets nowhere with the same account, even with the right password.
    other = session_from("127.0.0.2").post(base + "/_session", json={"name": "tablet", "password": PASSWORD}, timeout=60)
    assert other.status_code == 429, other.text
    basic = session_from("127.0.0.2").get(base + "/_all_dbs", auth=("tablet", PASSWORD), timeout=60)
    assert basic.status_code == 429, basic.text


def test_a_session_cookie_works_only_on_the_listener_that_issued_it(root):
    n = couch_user_node(root, "cookies", lan=True)
    loopback = n.info["couchURL"].rstrip("/")
    lan = n.info["couchLANURL"].rstrip("/")

    def login(base):
        r = requests.post(base + "/_session", json={"name": "tablet", "password": PASSWORD}, verify=False, timeout=60)
        assert r.status_code == 200, r.text
        return r.cookies["AuthSession"]

    from_lan, from_loopback = login(lan), login(loopback)

    def status(base, cookie):
        return requests.get(base + "/_all_dbs", cookies={"AuthSession": cookie}, verify=False, timeout=60).status_code

    assert status(lan, from_lan) == 200
    assert status(loopback, from_loopback) == 200
    assert status(loopback, from_lan) == 401
    assert status(lan, from_loopback) == 401


def test_the_password_never_appears_in_the_command_line(root):
    refused = node(root, "argv").ferry("serve", "--no-discovery", "--password", "peer:" + PASSWORD)
    assert refused.returncode == 64, refused.stderr
    assert "--password-file" in refused.stderr and "FERRY_PASSWORD" in refused.stderr

    loose = secret_file(root[0], "peer:" + PASSWORD, mode=0o644)
    world = node(root, "loose").ferry("serve", "--no-discovery", "--password-file", loose)
    assert world.returncode == 64 and "chmod 600" in world.stderr, world.stderr

    by_file = node(root, "file")
    by_file.start("--password-file", secret_file(root[0], "peer:" + PASSWORD))
    by_env = node(root, "env")
    by_env.start(env=dict(os.environ, FERRY_PASSWORD="peer:" + PASSWORD))
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert PASSWORD not in ps
    for n in (by_file, by_env):
        with open("/proc/%d/cmdline" % n.proc.pid, "rb") as f:
            assert PASSWORD.encode() not in f.read()
        # Both really require the password: a wrong one is refused, the right one upgrades.
        assert upgrade_status(n.info["url"], "peer", "wrong") == 401
        assert upgrade_status(n.info["url"], "peer", PASSWORD) == 101

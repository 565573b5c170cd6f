"""Attacks on Mango queries (`_find`, `_explain`) through a real node's CouchDB API.

Each test replays an attack seen against running nodes and asserts the refusal:

- a 200,000-value `$in` on an indexed field is answered at once (400 naming the limit), and
  the node's other APIs keep answering meanwhile;
- a long query whose client goes away stops working (the node's CPU time goes flat);
- `$regex` `(a+)+$` over 36 `a` and a `!` is refused with 400 instead of backtracking for seconds;
- a restricted user's indexed equality probe with `execution_stats` (and `_explain`) reveals
  nothing about documents it may not read.

The node is started here: FERRY_BINARY names the `ferry` executable (default
.build/debug/ferry). Timings are printed (run with -s to see them); none is asserted
except the generous bounds that tell "answered" from "stalled".

    .venv-couch/bin/python -m pytest Integration/attacks/test_query.py -q -s
    .venv-couch/bin/python Integration/attacks/test_query.py bench   # figures only
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import quote, urlparse

import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("FERRY_BINARY") or os.path.join(ROOT, ".build", "debug", "ferry")
READER_PASSWORD = "reader-password-1234"
DOCS = 20_000


class QueryNode:
    """One `ferry serve` with a user `reader` who may read only `pub/…` documents."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="ferry-attack-query-")
        self.data = os.path.join(self.root, "data")
        password_file = os.path.join(self.root, "password")
        with open(password_file, "w") as f:
            f.write(READER_PASSWORD + "\n")
        entry = json.loads(
            subprocess.run(
                [BINARY, "couch-user", "reader", "--iterations", "10000", "--password-file", password_file],
                check=True, capture_output=True, text=True).stdout)
        entry["policy"] = {"read": {"prefixes": ["pub/"]}, "write": "none", "mayDelete": False}
        config = os.path.join(self.root, "config.json")
        with open(config, "w") as f:
            json.dump({"couch": {"users": [entry]}}, f)
        self.log = open(os.path.join(self.root, "node.log"), "w")
        self.process = subprocess.Popen(
            [BINARY, "serve", "--data", self.data, "--config", config, "--port", "0", "--admin-port", "0",
             "--couch-port", "0", "--no-discovery"],
            stdout=self.log, stderr=self.log)
        info_path = os.path.join(self.data, "node.json")
        deadline = time.time() + 60
        info = None
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("ferry serve exited %s; log in %s" % (self.process.returncode, self.log.name))
            try:
                with open(info_path) as f:
                    info = json.load(f)
                if info.get("couchURL") and info.get("adminURL"):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("ferry serve did not write node.json")
        self.couch = info["couchURL"].rstrip("/")
        self.admin_url = info["adminURL"].rstrip("/")
        with open(os.path.join(self.data, "admin.key")) as f:
            key = f.read().strip()
        self.admin = requests.Session()
        self.admin.headers["Authorization"] = "Bearer " + key
        self.db = self.couch + "/" + (self.admin.get(self.admin_url + "/").json().get("group") or "ferry")
        self.reader = requests.Session()
        r = self.reader.post(self.couch + "/_session", json={"name": "reader", "password": READER_PASSWORD})
        assert r.status_code == 200, r.text

    def cpu_seconds(self):
        with open("/proc/%d/stat" % self.process.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        if not os.environ.get("KEEP_IT_ROOT"):
            shutil.rmtree(self.root, ignore_errors=True)


def seed(node):
    """Documents the attacks run against: DOCS public ones with `n` and `s`, two hidden ones
    with a secret, and indexes on `n` and (in a design document only the admin may read) on `secret`."""
    admin = node.admin
    for start in range(0, DOCS, 5000):
        docs = [{"_id": "pub/%06d" % i, "n": i, "s": "value %d" % i} for i in range(start, min(DOCS, start + 5000))]
        r = admin.post(node.db + "/_bulk_docs", json={"docs": docs})
        assert r.status_code == 201, r.text
    for doc in [{"_id": "priv/1", "secret": "hunter2"}, {"_id": "priv/2", "secret": "hunter2"},
                {"_id": "pub/evil", "s": "a" * 36 + "!"}]:
        r = admin.put(node.db + "/" + quote(doc["_id"], safe=""), json=doc)
        assert r.status_code == 201, r.text
    for body in [{"index": {"fields": ["n"]}, "ddoc": "by-n", "name": "n"},
                 {"index": {"fields": ["secret"]}, "ddoc": "hidden", "name": "by-secret"}]:
        r = admin.post(node.db + "/_index", json=body)
        assert r.status_code == 200, r.text
    # Wait until both indexes are built (POST /_index builds for at most a second itself).
    deadline = time.time() + 120
    while admin.get(node.couch + "/_active_tasks").json() and time.time() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="module")
def node():
    n = QueryNode()
    try:
        seed(n)
        yield n
    finally:
        n.stop()


class Prober:
    """Times `GET /_up` (CouchDB API) and `GET /` (admin API) in a loop while an attack runs."""

    def __init__(self, node):
        self.node = node
        self.worst = 0.0
        self.failures = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.done.is_set():
            for url, session in [(self.node.couch + "/_up", requests), (self.node.admin_url + "/", self.node.admin)]:
                started = time.time()
                try:
                    status = session.get(url, timeout=10).status_code
                    if status != 200:
                        self.failures.append("%s answered %d" % (url, status))
                except requests.RequestException as e:
                    self.failures.append("%s: %s" % (url, e))
                self.worst = max(self.worst, time.time() - started)
            time.sleep(0.25)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def in_query(count, field="n"):
    return {"selector": {field: {"$in": list(range(count))}}, "limit": 1}


def test_a_200k_in_is_answered_at_once_and_other_apis_keep_answering(node):
    with Prober(node) as prober:
        started = time.time()
        r = node.reader.post(node.db + "/_find", json=in_query(200_000), timeout=60)
        elapsed = time.time() - started
    print("\n$in of 200000 values: %d in %.2f s; slowest other-API answer meanwhile %.2f s" % (
        r.status_code, elapsed, prober.worst))
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request"
    assert "maximumOperands" in r.json()["reason"]
    assert elapsed < 15
    assert not prober.failures, prober.failures
    assert prober.worst < 5
    # The largest allowed list is planned at once and answered.
    started = time.time()
    r = node.reader.post(node.db + "/_find", json=in_query(10_000), timeout=60)
    print("$in of 10000 values (the limit): %d in %.2f s" % (r.status_code, time.time() - started))
    assert r.status_code == 200, r.text


def slow_query():
    # Every public document is read and matched against 10,000 values that none holds.
    return {"selector": {"s": {"$in": ["missing %d" % i for i in range(10_000)]}}, "limit": 1,
            "execution_stats": True}


def test_an_abandoned_query_stops_working(node):
    started = time.time()
    full = node.admin.post(node.db + "/_find", json=slow_query(), timeout=120)
    duration = time.time() - started
    print("\nthe slow query, awaited: %d in %.2f s" % (full.status_code, duration))
    assert full.status_code in (200, 500), full.text
    if duration < 3:
        pytest.skip("the slow query took only %.1f s here: too short to tell stopping from finishing" % duration)

    # Send it and go away after half a second.
    parsed = urlparse(node.couch)
    body = json.dumps(slow_query()).encode()
    auth = node.admin.headers["Authorization"]
    sock = socket.create_connection((parsed.hostname, parsed.port))
    sock.sendall(
        ("POST %s/_find HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/json\r\n"
         "Content-Length: %d\r\n\r\n" % (urlparse(node.db).path, parsed.netloc, auth, len(body))).encode() + body)
    time.sleep(1)
    working = node.cpu_seconds()
    time.sleep(1)
    working = node.cpu_seconds() - working
    sock.close()
    time.sleep(0.5)
    # Nothing else runs meanwhile (the probes of the other APIs cost CPU of their own).
    window = min(duration - 2, 5)
    before = node.cpu_seconds()
    time.sleep(window)
    used = node.cpu_seconds() - before
    print("while the client waited: %.2f s of CPU in 1 s; after it went away: %.2f s of CPU in the next %.1f s" % (
        working, used, window))
    assert working > 0.5, "the query was not running"
    assert used < 0.2 * window, "the abandoned query kept working"


def test_a_catastrophic_regex_is_refused_at_once(node):
    started = time.time()
    r = node.reader.post(node.db + "/_find", json={"selector": {"_id": "pub/evil", "s": {"$regex": "(a+)+$"}}},
                         timeout=120)
    elapsed = time.time() - started
    print("\n$regex (a+)+$ on 37 characters: %d in %.2f s" % (r.status_code, elapsed))
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request"
    assert "maximumRegexTicks" in r.json()["reason"]
    assert elapsed < 5


def test_execution_stats_and_explain_reveal_nothing_hidden(node):
    probes = {}
    for value in ["hunter2", "not-there"]:
        r = node.reader.post(node.db + "/_find", json={
            "selector": {"secret": value}, "execution_stats": True, "use_index": ["_design/hidden", "by-secret"]})
        assert r.status_code == 200, r.text
        assert r.json()["docs"] == []
        stats = r.json()["execution_stats"]
        probes[value] = (stats["total_keys_examined"], stats["total_docs_examined"], stats["results_returned"])
        bookmark = r.json()["bookmark"]
        assert bookmark == "nil", bookmark
    print("\nprobe stats (keys, docs, results): %s" % probes)
    assert probes["hunter2"] == probes["not-there"]
    r = node.reader.post(node.db + "/_find", json={"selector": {"_id": "priv/1"}, "execution_stats": True})
    assert r.json()["execution_stats"]["total_docs_examined"] == 0
    assert r.json()["execution_stats"]["total_keys_examined"] == 0
    explained = node.reader.post(node.db + "/_explain", json={"selector": {"secret": "hunter2"}})
    assert explained.status_code == 200, explained.text
    assert "hidden" not in explained.text and "by-secret" not in explained.text
    # The admin, who may read them, still has them counted.
    r = node.admin.post(node.db + "/_find", json={"selector": {"secret": "hunter2"}, "execution_stats": True})
    assert r.json()["execution_stats"]["total_docs_examined"] == 2


def bench():
    """Figures only: `$in` sizes against an indexed field, and the regex case."""
    n = QueryNode()
    try:
        seed(n)
        for count in [8_000, 16_000, 200_000]:
            started = time.time()
            try:
                r = n.reader.post(n.db + "/_find", json=in_query(count), timeout=float(os.environ.get("BENCH_TIMEOUT", 120)))
                print("$in %7d values: %d in %.2f s" % (count, r.status_code, time.time() - started), flush=True)
            except requests.Timeout:
                print("$in %7d values: no answer within %.0f s" % (count, time.time() - started), flush=True)
                break
        started = time.time()
        try:
            r = n.reader.post(n.db + "/_find", json={"selector": {"_id": "pub/evil", "s": {"$regex": "(a+)+$"}}}, timeout=120)
            print("$regex (a+)+$ on 37 characters: %d in %.2f s" % (r.status_code, time.time() - started))
        except requests.Timeout:
            print("$regex (a+)+$ on 37 characters: no answer within %.0f s" % (time.time() - started))
    finally:
        n.stop()


if __name__ == "__main__" and sys.argv[1:] == ["bench"]:
    bench()

"""Leaks through the CouchDB API attacked by restricted users of a real `ferry serve`.

Starts its own node (ephemeral ports, a temporary data directory, no DNS-SD) from the ferry
binary in $FERRY_BINARY (default .build/debug/ferry), founds a group on it and types the
clinic's access rules as docs/operations.md ("Access by content") shows them: the node is a
supervisor, the role ward-a reads and writes {"ward":"a"}, ward-b {"ward":"b"}; the CouchDB
users nurse-a and nurse-a2 have the role ward-a, nurse-b ward-b. Each test asserts the refusal:

- `_local_docs` (GET and POST, `keys`, `key`, `include_docs`, `skip`, `limit`, key ranges,
  `descending`) shows nurse-b only its own `_local` documents, exactly those `GET /_local/ID`
  serves it: never nurse-a's or the admin's, nor their bodies, nor a count of them;
- an HTML attachment that nurse-a uploads, opened by nurse-a2 with a session cookie, is
  served with `Content-Security-Policy: sandbox` and `X-Content-Type-Options: nosniff`, as
  are the multipart answers that carry its bytes raw (`attachments=true`, `open_revs`,
  `_bulk_get`), so its script cannot act with nurse-a2's session;
- a refused JSON body says why (nesting, a number out of range, a duplicate key) in
  CouchDB's `bad_request` shape, and only invalid UTF-8 is called that.
"""

import json
import os
import shutil
import tempfile
import time
import urllib.parse

import pytest
import requests

from ferry_node import Node

NURSES = {"nurse-a": "ward-a", "nurse-a2": "ward-a", "nurse-b": "ward-b"}
PAGE = "<html><script>fetch('/clinic/_all_docs?include_docs=true').then(r => r.text()).then(alert)</script></html>"


class Clinic(Node):
    """One `ferry serve` that founded a group with the clinic's rules and nurses."""

    def __init__(self, root):
        super().__init__(root, "station")

    def ferry(self, *args, stdin=None):
        r = super().ferry(*args, stdin=stdin)
        assert r.returncode == 0, f"ferry {' '.join(args)}: {r.stdout}{r.stderr}"
        return r.stdout


@pytest.fixture(scope="module")
def clinic():
    root = tempfile.mkdtemp(prefix="ferry-attack-couch-")
    node = Clinic(root)
    try:
        info = node.start()
        with open(info["adminKeyFile"]) as f:
            key = f.read().strip()
        # The group's rules, as docs/operations.md types them on the admin's station.
        node.ferry("invite")
        node.ferry("access", "roles", info["id"], "supervisor")
        node.ferry("access", "rule", "add", "everything", "--role", "supervisor", "--read-all", "--write-all", "--delete")
        for ward in ["a", "b"]:
            selector = json.dumps({"ward": ward})
            node.ferry("access", "rule", "add", f"ward-{ward}", "--role", f"ward-{ward}",
                       "--read-selector", selector, "--write-selector", selector)
        for name, role in NURSES.items():
            node.ferry("couch-user", "add", name, "--iterations", "10000", stdin=f"{name}-pass-4711\n")
            node.ferry("access", "roles", f"user:{name}", role)
        group = requests.get(info["adminURL"] + "/", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["group"]
        c = {"base": info["couchURL"].rstrip("/"), "db": group, "admin": ("admin", key),
             "users": {n: (n, f"{n}-pass-4711") for n in NURSES}}
        # The rules are in force once a nurse of ward b no longer reads a ward-a document.
        r = requests.put(f"{c['base']}/{group}/patient-a", json={"ward": "a", "name": "A"}, auth=c["admin"], timeout=30)
        assert r.status_code == 201, r.text
        deadline = time.time() + 60
        while requests.get(f"{c['base']}/{group}/patient-a", auth=c["users"]["nurse-b"], timeout=30).status_code != 404:
            assert time.time() < deadline, "the access rules never applied to nurse-b"
            time.sleep(0.1)
        yield c
    finally:
        node.stop()
        if not os.environ.get("KEEP_IT_ROOT"):
            shutil.rmtree(root, ignore_errors=True)


def url(c, path):
    return f"{c['base']}/{c['db']}/{path}"


def q(value):
    return urllib.parse.quote(json.dumps(value), safe="")


def test_local_docs_show_a_restricted_user_only_its_own_local_documents(clinic):
    c = clinic
    writes = [("admin", c["admin"], "admin-cp", "ADMIN-SECRET"), ("nurse-a", c["users"]["nurse-a"], "a-cp", "WARD-A-SECRET"),
              ("nurse-b", c["users"]["nurse-b"], "b-cp", "ward-b-own"), ("nurse-b", c["users"]["nurse-b"], "b-cp2", "ward-b-own")]
    for who, auth, doc_id, secret in writes:
        r = requests.put(url(c, f"_local/{doc_id}"), json={"secret": secret, "session_id": who}, auth=auth, timeout=30)
        assert r.status_code == 201, r.text
    nurse_b = c["users"]["nurse-b"]
    for doc_id in ["admin-cp", "a-cp"]:
        assert requests.get(url(c, f"_local/{doc_id}"), auth=nurse_b, timeout=30).status_code == 404
    answers = [
        requests.get(url(c, "_local_docs?include_docs=true"), auth=nurse_b, timeout=30),
        requests.post(url(c, "_local_docs"), json={"include_docs": True}, auth=nurse_b, timeout=30),
        requests.post(url(c, "_local_docs"), auth=nurse_b, timeout=30,
                      json={"keys": ["_local/admin-cp", "_local/a-cp", "_local/b-cp"], "include_docs": True}),
        requests.get(url(c, f"_local_docs?include_docs=true&keys={q(['_local/a-cp', '_local/admin-cp'])}"), auth=nurse_b, timeout=30),
        requests.get(url(c, f"_local_docs?include_docs=true&key={q('_local/admin-cp')}"), auth=nurse_b, timeout=30),
        requests.get(url(c, "_local_docs?include_docs=true&skip=1&limit=1"), auth=nurse_b, timeout=30),
        requests.get(url(c, f"_local_docs?include_docs=true&startkey={q('_local/a')}&endkey={q('_local/b')}"), auth=nurse_b, timeout=30),
        requests.get(url(c, "_local_docs?include_docs=true&descending=true"), auth=nurse_b, timeout=30),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
        assert "ADMIN-SECRET" not in r.text and "WARD-A-SECRET" not in r.text, r.text
        assert r.json()["total_rows"] is None and r.json()["offset"] is None, r.text
        for row in r.json()["rows"]:
            if "error" in row:
                continue
            # Each row listed is one GET /_local/ID serves nurse-b, with the same body.
            one = requests.get(url(c, row["id"]), auth=nurse_b, timeout=30)
            assert one.status_code == 200 and one.json() == row["doc"], (row, one.text)
    listed, posted, keyed, keyed_get, one_key, paged, ranged, down = [r.json()["rows"] for r in answers]
    assert [row["id"] for row in listed] == ["_local/b-cp", "_local/b-cp2"]
    assert posted == listed
    assert [row.get("error") for row in keyed] == ["not_found", "not_found", None]
    assert [row.get("error") for row in keyed_get + one_key] == ["not_found"] * 3
    assert [row["id"] for row in paged] == ["_local/b-cp2"]
    assert ranged == []
    assert [row["id"] for row in down] == ["_local/b-cp2", "_local/b-cp"]
    # Whoever reads every document lists every one, as GET serves them.
    everything = requests.get(url(c, "_local_docs"), auth=c["admin"], timeout=30).json()["rows"]
    assert {"_local/admin-cp", "_local/a-cp", "_local/b-cp", "_local/b-cp2"} <= {row["id"] for row in everything}


def test_an_html_attachment_opened_with_a_session_runs_sandboxed(clinic):
    c = clinic
    nurse_a = c["users"]["nurse-a"]
    r = requests.put(url(c, "patient-a-page"), json={"ward": "a"}, auth=nurse_a, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.put(url(c, f"patient-a-page/page.html?rev={r.json()['rev']}"), data=PAGE.encode(), auth=nurse_a,
                     headers={"Content-Type": "text/html"}, timeout=30)
    assert r.status_code == 201, r.text
    victim = requests.Session()
    name, password = c["users"]["nurse-a2"]
    r = victim.post(f"{c['base']}/_session", json={"name": name, "password": password}, timeout=30)
    assert r.status_code == 200 and "AuthSession" in victim.cookies, r.text
    answers = {
        "GET": victim.get(url(c, "patient-a-page/page.html"), timeout=30),
        "HEAD": victim.head(url(c, "patient-a-page/page.html"), timeout=30),
        "Range": victim.get(url(c, "patient-a-page/page.html"), headers={"Range": "bytes=0-5"}, timeout=30),
        "multipart/related": victim.get(url(c, "patient-a-page?attachments=true"), headers={"Accept": "multipart/related"}, timeout=30),
        "open_revs": victim.get(url(c, "patient-a-page?open_revs=all"), headers={"Accept": "multipart/mixed"}, timeout=30),
        "_bulk_get": victim.post(url(c, "_bulk_get?attachments=true"), json={"docs": [{"id": "patient-a-page"}]},
                                 headers={"Accept": "multipart/mixed"}, timeout=30),
    }
    assert answers["GET"].status_code == 200 and answers["GET"].text == PAGE
    assert answers["GET"].headers["Content-Type"].startswith("text/html")
    for what, r in answers.items():
        assert r.status_code in (200, 206), (what, r.status_code, r.text[:300])
        if what not in ("HEAD", "Range"):
            assert "<script>" in r.text, (what, r.text[:300])
        assert r.headers.get("Content-Security-Policy") == "sandbox", (what, dict(r.headers))
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (what, dict(r.headers))


@pytest.mark.parametrize("body,reason", [
    ('{"ward":"a","x":' + "[" * 300 + "]" * 300 + "}", "nesting deeper than"),
    ('{"ward":"a","n":1e400}', "number out of range"),
    ('{"ward":"a","ward":"b"}', 'duplicate key "ward"'),
])
def test_refused_json_names_its_reason(clinic, body, reason):
    c = clinic
    nurse_a = c["users"]["nurse-a"]
    for method, path in [("PUT", "json-probe"), ("POST", "_bulk_docs"), ("POST", "_all_docs"), ("PUT", "_local/json-probe")]:
        r = requests.request(method, url(c, path), data=body.encode(), auth=nurse_a,
                             headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"] == "bad_request", (path, r.text)
        assert reason in r.json()["reason"] and "UTF-8" not in r.json()["reason"], (path, r.text)
    r = requests.put(url(c, "json-probe"), data=b'{"ward":"\xff"}', auth=nurse_a,
                     headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "invalid UTF-8" in r.json()["reason"], r.text

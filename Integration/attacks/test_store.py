"""Store attacks through a real node's CouchDB API: wide documents, `_revs_diff` probes and
blobs nothing refers to.

Run by Integration/Scenarios/AttackStoreScenarios.swift against a `ferry serve` whose config
has the user $FERRY_USER (password $FERRY_USER_PASSWORD) with the policy
{"read":{"types":["note"]},"write":{"types":["note"]},"mayDelete":false}, blob collection
every 2 s with a 1 s grace period, its data directory in $FERRY_DATA, and the admin key in
$FERRY_ADMIN_KEY. Each test asserts the refusal or the bound, and prints its figures:

- 1,000 replicated leaves (`new_edits:false`) go into a document that already has 10,000
  about as fast as into a fresh one (per-batch cost, not per-leaf cost, grows with width);
- `_revs_diff` of 8k, 16k and 32k revisions grows linearly;
- `_revs_diff` with invented or guessed revisions of a document the user may not read
  answers every revision missing and names none, so nothing can be confirmed offline;
- a blob that nothing refers to any more is deleted by the running node; a referenced one stays.
"""

import base64
import hashlib
import json
import os
import time
import urllib.parse

import requests

BASE = os.environ["FERRY_COUCH_URL"].rstrip("/")
DB = os.environ["FERRY_COUCH_DB"]
DATA = os.environ["FERRY_DATA"]
ADMIN = ("admin", os.environ["FERRY_ADMIN_KEY"])
USER = (os.environ["FERRY_USER"], os.environ["FERRY_USER_PASSWORD"])


def url(path):
    return f"{BASE}/{DB}/{path}"


def doc_url(doc_id, query=""):
    return url(urllib.parse.quote(doc_id, safe="") + query)


def admin_put(doc_id, body, rev=None):
    r = requests.put(doc_url(doc_id, f"?rev={rev}" if rev else ""), json=body, auth=ADMIN, timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["rev"]


ROOT_HASH = "0" * 32


def leaves(doc_id, start, count):
    """`new_edits:false` generation-2 leaves under one root, each its own branch."""
    return [
        {"_id": doc_id, "_rev": f"2-{i + 1:032x}", "n": i,
         "_revisions": {"start": 2, "ids": [f"{i + 1:032x}", ROOT_HASH]}}
        for i in range(start, start + count)
    ]


def insert_leaves(doc_id, start, count, batch=1000):
    t0 = time.monotonic()
    for first in range(start, start + count, batch):
        docs = leaves(doc_id, first, min(batch, start + count - first))
        r = requests.post(url("_bulk_docs"), json={"docs": docs, "new_edits": False}, auth=ADMIN, timeout=300)
        assert r.status_code == 201, r.text
        assert not [row for row in r.json() if "error" in row], r.text[:500]
    return time.monotonic() - t0


def root(doc_id):
    doc = {"_id": doc_id, "_rev": f"1-{ROOT_HASH}", "root": True}
    r = requests.post(url("_bulk_docs"), json={"docs": [doc], "new_edits": False}, auth=ADMIN, timeout=60)
    assert r.status_code == 201, r.text


def test_a_thousand_leaves_into_a_wide_document_cost_about_what_they_cost_into_a_fresh_one():
    root("leaves/fresh")
    fresh = insert_leaves("leaves/fresh", 0, 1000)
    root("leaves/wide")
    insert_leaves("leaves/wide", 0, 10_000)
    wide = insert_leaves("leaves/wide", 10_000, 1000)
    print(f"\n1,000 leaves: fresh document {fresh:.2f} s, document of 10,000 leaves {wide:.2f} s, ratio {wide / fresh:.1f}")
    r = requests.post(url("_revs_diff"), json={"leaves/wide": [f"2-{i:032x}" for i in (1, 5000, 11_000, 11_001)]},
                      auth=ADMIN, timeout=60)
    assert r.json()["leaves/wide"]["missing"] == [f"2-{11_001:032x}"]
    assert wide < 60, f"1,000 leaves into a wide document took {wide:.1f} s"


def test_revs_diff_grows_linearly_with_the_revisions_asked():
    admin_put("diff/target", {"a": 1})
    times = []
    for n in (8192, 16384, 32768):
        revs = [f"2-{i:064x}" for i in range(n)]
        t0 = time.monotonic()
        r = requests.post(url("_revs_diff"), json={"diff/target": revs}, auth=ADMIN, timeout=120)
        times.append(time.monotonic() - t0)
        assert r.status_code == 200, r.text[:300]
        assert len(r.json()["diff/target"]["missing"]) == n
    ratios = ", ".join(f"{b / a:.2f}" for a, b in zip(times, times[1:]))
    print(f"\n_revs_diff 8k/16k/32k: {', '.join(f'{t:.3f} s' for t in times)}; ratio per doubling {ratios} (linear 2, quadratic 4)")
    assert times[-1] < 10, f"_revs_diff of 32k revisions took {times[-1]:.1f} s"


def test_revs_diff_reveals_nothing_of_a_document_the_user_may_not_read():
    rev = admin_put("vault/pin", {"type": "secret", "pin": "4711"})
    guess = "2-" + "e" * 64
    r = requests.post(url("_revs_diff"), json={"vault/pin": [guess, rev]}, auth=USER, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"vault/pin": {"missing": [guess, rev]}}, r.text
    # A readable winner does not open a document with an unreadable leaf.
    note = admin_put("vault/mixed", {"type": "note", "v": 1})
    for v in (2, 3):
        note = admin_put("vault/mixed", {"type": "note", "v": v}, rev=note)
    hidden = {"_id": "vault/mixed", "_rev": "2-" + "f" * 32, "type": "secret", "pin": "0815",
              "_revisions": {"start": 2, "ids": ["f" * 32, "a" * 32]}}
    r = requests.post(url("_bulk_docs"), json={"docs": [hidden], "new_edits": False}, auth=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(url("_revs_diff"), json={"vault/mixed": [guess, note, hidden["_rev"]]}, auth=USER, timeout=30)
    assert r.json() == {"vault/mixed": {"missing": [guess, note, hidden["_rev"]]}}, r.text
    # The admin still sees what exists.
    r = requests.post(url("_revs_diff"), json={"vault/pin": [guess, rev]}, auth=ADMIN, timeout=30)
    assert r.json()["vault/pin"] == {"missing": [guess], "possible_ancestors": [rev]}, r.text


def blob_path(content):
    digest = hashlib.sha256(content).hexdigest()
    return os.path.join(DATA, "blobs", digest[:2], digest)


def test_the_running_node_deletes_blobs_nothing_refers_to():
    kept = os.urandom(1 << 20)
    admin_put("blobs/kept", {"_attachments": {"a": {"content_type": "application/octet-stream",
                                                      "data": base64.b64encode(kept).decode()}}})
    dropped = [os.urandom(1 << 20) for _ in range(3)]
    for i, content in enumerate(dropped):
        rev = admin_put(f"blobs/dropped-{i}", {"_attachments": {"a": {"content_type": "application/octet-stream",
                                                                       "data": base64.b64encode(content).decode()}}})
        # Edits without the attachment push its revision beyond the bodies kept for deltas.
        for v in range(4):
            rev = admin_put(f"blobs/dropped-{i}", {"v": v}, rev=rev)
    assert os.path.exists(blob_path(kept))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(os.path.exists(blob_path(c)) for c in dropped):
        time.sleep(0.5)
    gone = [not os.path.exists(blob_path(c)) for c in dropped]
    print(f"\nblob collection: {sum(gone)} of {len(dropped)} unreferenced blobs of 1 MiB deleted by the running node")
    assert all(gone)
    assert os.path.exists(blob_path(kept))
    r = requests.get(doc_url("blobs/kept") + "/a", auth=ADMIN, timeout=30)
    assert r.status_code == 200 and r.content == kept

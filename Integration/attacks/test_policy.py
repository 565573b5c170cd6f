"""Policy attacks through a real node's CouchDB API, as a type-restricted user.

Run by Integration/Scenarios/AttackPolicyScenarios.swift against a `ferry serve` whose
config has the user $FERRY_USER (password $FERRY_USER_PASSWORD) with the policy
{"read":{"types":["note"]},"write":{"types":["note"]},"mayDelete":false}, and the admin key
in $FERRY_ADMIN_KEY. Each test asserts the refusal:

- a child `{"type":"note"}` PUT onto a `type:"secret"` document is refused (403);
- a `new_edits:false` branch of higher generation typed `note` is refused, by PUT and by
  `_bulk_docs`, and the secret document keeps a single leaf;
- when a note does win over a secret leaf (written by the admin), `?open_revs=all`,
  `_bulk_get`, `_all_docs` and `_changes` reveal nothing of the document;
- `_all_docs` `offset` and `total_rows` count only readable documents, so bisecting with
  `startkey` rebuilds no hidden ID;
- a document referring to a blob known only by its digest is refused;
- nothing can be written under `_ferry/`, even by the admin, through this API.
"""

import base64
import json
import os
import urllib.parse

import requests

BASE = os.environ["FERRY_COUCH_URL"].rstrip("/")
DB = os.environ["FERRY_COUCH_DB"]
ADMIN = ("admin", os.environ["FERRY_ADMIN_KEY"])
USER = (os.environ["FERRY_USER"], os.environ["FERRY_USER_PASSWORD"])


def url(path):
    return f"{BASE}/{DB}/{path}"


def doc_url(doc_id, query=""):
    return url(urllib.parse.quote(doc_id, safe="") + query)


def admin_put(doc_id, body):
    r = requests.put(doc_url(doc_id), json=body, auth=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["rev"]


def branch(doc_id, generation, body, letter):
    """A `new_edits:false` revision of `generation` on a branch of its own."""
    ids = [letter * 32] + [chr(ord(letter) - i - 1) * 32 for i in range(generation - 1)]
    return dict(body, _id=doc_id, _rev=f"{generation}-{ids[0]}", _revisions={"start": generation, "ids": ids})


def test_a_note_child_cannot_overwrite_a_secret():
    rev = admin_put("patients/1", {"type": "secret", "pin": "1234"})
    r = requests.put(doc_url("patients/1", f"?rev={rev}"), json={"type": "note"}, auth=USER, timeout=30)
    assert r.status_code == 403, r.text
    r = requests.get(doc_url("patients/1"), auth=ADMIN, timeout=30)
    assert r.json()["_rev"] == rev and r.json()["type"] == "secret"


def test_a_higher_branch_cannot_outrank_a_secret():
    rev = admin_put("patients/2", {"type": "secret", "pin": "4711"})
    doc = branch("patients/2", 3, {"type": "note"}, "f")
    r = requests.put(doc_url("patients/2", "?new_edits=false"), json=doc, auth=USER, timeout=30)
    assert r.status_code == 403, r.text
    r = requests.post(url("_bulk_docs"), json={"docs": [doc], "new_edits": False}, auth=USER, timeout=30)
    assert r.status_code == 201 and r.json()[0].get("error") == "forbidden", r.text
    r = requests.get(doc_url("patients/2", "?open_revs=all"), auth=ADMIN, timeout=30,
                     headers={"Accept": "application/json"})
    assert [item["ok"]["_rev"] for item in r.json()] == [rev]


def test_a_document_with_a_secret_leaf_is_invisible_to_the_reader():
    admin_put("patients/3", {"type": "secret", "pin": "9999"})
    doc = branch("patients/3", 3, {"type": "note"}, "c")
    r = requests.put(doc_url("patients/3", "?new_edits=false"), json=doc, auth=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    reads = [
        requests.get(doc_url("patients/3", "?open_revs=all"), auth=USER, timeout=30, headers={"Accept": "application/json"}),
        requests.get(doc_url("patients/3", "?conflicts=true"), auth=USER, timeout=30),
        requests.post(url("_bulk_get"), json={"docs": [{"id": "patients/3"}]}, auth=USER, timeout=30),
        requests.get(url("_all_docs?include_docs=true"), auth=USER, timeout=30),
        requests.get(url("_changes?include_docs=true&style=all_docs"), auth=USER, timeout=30),
    ]
    for r in reads:
        assert "9999" not in r.text, r.text
    assert reads[0].status_code == 404 and reads[1].status_code == 404
    assert "patients/3" not in reads[3].text
    assert "patients/3" not in reads[4].text


def test_offsets_and_totals_count_only_readable_documents():
    for doc_id in ["n-a", "n-c", "n-e"]:
        admin_put(doc_id, {"type": "note"})
    for doc_id in ["n-b-hidden", "n-d-hidden"]:
        admin_put(doc_id, {"type": "secret"})

    def offset(start):
        r = requests.get(url("_all_docs"), params={"startkey": json.dumps(start), "limit": 0}, auth=USER, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["offset"], r.json()["total_rows"]

    # Any two start keys between two readable IDs give the same answer: no hidden ID shows.
    assert offset("n-b") == offset("n-b-z") == offset("n-c")
    readable = requests.get(url("_all_docs"), auth=USER, timeout=30).json()
    assert offset("n-c")[1] == len(readable["rows"])


def test_a_blob_known_only_by_digest_cannot_be_claimed():
    import hashlib
    content = b"x-ray of patient 4"
    data = base64.b64encode(content).decode()
    r = requests.put(doc_url("patients/4"), auth=ADMIN, timeout=30, json={
        "type": "secret", "_attachments": {"scan": {"content_type": "image/png", "data": data}}})
    assert r.status_code == 201, r.text
    stored = requests.get(doc_url("patients/4"), auth=ADMIN, timeout=30).json()
    digest = stored["_attachments"]["scan"]["digest"]
    # Ferry's own reference form, by SHA-256: the attacker knows the content's hash.
    ref = {"@type": "blob", "digest": "sha256-" + hashlib.sha256(content).hexdigest(), "length": len(content)}
    r = requests.put(doc_url("notes/steal"), json={"type": "note", "scan": ref}, auth=USER, timeout=30)
    assert r.status_code == 403, r.text
    # A stub naming the digest in another document resolves to nothing either.
    r = requests.put(doc_url("notes/steal2"), auth=USER, timeout=30, json={
        "type": "note", "_attachments": {"scan": {"stub": True, "digest": digest, "content_type": "image/png"}}})
    assert r.status_code in (400, 403, 412), r.text
    r = requests.get(doc_url("notes/steal2") + "/scan", auth=USER, timeout=30)
    assert r.status_code == 404 and content not in r.content


def test_nothing_is_written_under_ferrys_namespace():
    doc = {"_id": "_ferry/hidden", "_rev": "1-" + "a" * 32, "x": 1}
    r = requests.post(url("_bulk_docs"), json={"docs": [doc], "new_edits": False}, auth=ADMIN, timeout=30)
    assert r.status_code == 201 and r.json()[0].get("error") == "forbidden", r.text
    r = requests.get(url("_all_docs"), params={"keys": json.dumps(["_ferry/hidden"])}, auth=ADMIN, timeout=30)
    assert r.json()["rows"][0].get("error") == "not_found", r.text

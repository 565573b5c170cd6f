"""The reference replicator (refrep.py) replicates between two CouchDB-protocol databases in
both directions, with conflicts, deletions and attachments, and they converge: the same
leaves, the same winner, the same attachment digests and bytes for every document; a run
with nothing new transfers nothing; checkpoints live in `_local` and never replicate."""

import pytest

from couchhttp import b64, md5_digest, quote_id
from refrep import Replicator, replicate

pytestmark = pytest.mark.two_servers

PHOTO = bytes((i * 31 + 7) % 256 for i in range(120_000))
NOTE = ("a note that compresses well\n" * 100).encode()


def leaves(server, doc_id):
    r = server.request("GET", server.doc_url(doc_id), params={"open_revs": "all", "revs": "true"},
                       headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    return {item["ok"]["_rev"]: item["ok"] for item in r.json() if "ok" in item}


def winner(server, doc_id):
    r = server.request("GET", server.doc_url(doc_id), params={"conflicts": "true", "deleted_conflicts": "true"},
                       headers={"Accept": "application/json"})
    if r.status_code == 404:
        return ("deleted", r.json()["reason"])
    assert r.status_code == 200, r.text
    doc = r.json()
    return (doc["_rev"], sorted(doc.get("_conflicts", [])), sorted(doc.get("_deleted_conflicts", [])))


def attachment_bytes(server, doc_id, name, rev):
    r = server.request("GET", server.doc_url(doc_id, name), params={"rev": rev})
    assert r.status_code == 200, f"{doc_id}/{name}@{rev}: {r.status_code} {r.text[:200]}"
    return r.content


def assert_converged(a, b, ids):
    for doc_id in ids:
        leaves_a, leaves_b = leaves(a, doc_id), leaves(b, doc_id)
        assert set(leaves_a) == set(leaves_b), f"{doc_id}: leaves differ: {sorted(leaves_a)} vs {sorted(leaves_b)}"
        assert winner(a, doc_id) == winner(b, doc_id), f"{doc_id}: winners differ"
        for rev, doc_a in leaves_a.items():
            doc_b = leaves_b[rev]
            body_a = {k: v for k, v in doc_a.items() if k != "_attachments"}
            body_b = {k: v for k, v in doc_b.items() if k != "_attachments"}
            assert body_a == body_b, f"{doc_id}@{rev}: bodies differ"
            atts_a, atts_b = doc_a.get("_attachments", {}), doc_b.get("_attachments", {})
            assert set(atts_a) == set(atts_b), f"{doc_id}@{rev}: attachment names differ"
            for name in atts_a:
                for key in ("digest", "length", "content_type", "revpos"):
                    assert atts_a[name].get(key) == atts_b[name].get(key), f"{doc_id}@{rev}/{name}: {key} differs"
                assert attachment_bytes(a, doc_id, name, rev) == attachment_bytes(b, doc_id, name, rev)


def both_ways(a, b, **options):
    return replicate(a, b, **options), replicate(b, a, **options)


def test_replicates_both_ways_with_conflicts_deletions_and_attachments_and_converges(server, server_b, uid):
    a, b = server, server_b
    ids = [uid + n for n in ("a1", "a2", "a3", "gone", "shared", "b1", "b2", "late")]
    # Before any replication: documents on both sides, attachments, a tombstone.
    a.bulk_docs([{"_id": uid + "a1", "n": 1}, {"_id": uid + "a2", "n": 2}, {"_id": uid + "shared", "by": "a"}])
    a.create(uid + "a3", {"kind": "photo", "_attachments": {
        "photo.bin": {"content_type": "application/octet-stream", "data": b64(PHOTO)},
        "note.txt": {"content_type": "text/plain", "data": b64(NOTE)}}})
    gone = a.create(uid + "gone", {"n": 0})
    a.remove(uid + "gone", gone)
    b.bulk_docs([{"_id": uid + "b1", "n": 10}])
    b.create(uid + "b2", {"_attachments": {"b.bin": {"content_type": "image/x-test", "data": b64(PHOTO[:999])}}})

    first_ab, first_ba = both_ways(a, b)
    assert first_ab["doc_write_failures"] == 0 and first_ba["doc_write_failures"] == 0
    assert first_ab["docs_written"] >= 5 and first_ba["docs_written"] >= 2
    assert_converged(a, b, ids[:-1])

    # The same document edited on both sides (a conflict), a deletion on B of A's document,
    # an attachment added on A next to an unchanged one (sent as a stub: atts_since),
    # and an edit of B's document on B.
    shared_a = a.doc(uid + "shared")
    shared_b = b.doc(uid + "shared")
    a.update(uid + "shared", shared_a["_rev"], {"by": "a", "edit": 2})
    b.update(uid + "shared", shared_b["_rev"], {"by": "b", "edit": 2})
    b.remove(uid + "a2", b.doc(uid + "a2")["_rev"])
    photo = a.doc(uid + "a3")
    photo["_attachments"]["extra.bin"] = {"content_type": "application/octet-stream", "data": b64(b"extra bytes")}
    r = a.put(quote_id(uid + "a3"), photo)
    assert r.status_code == 201, r.text
    b2 = b.doc(uid + "b2")
    b.update(uid + "b2", b2["_rev"], dict(b2, edited=True))
    a.create(uid + "late", {"n": 99})

    second_ab, second_ba = both_ways(a, b)
    assert second_ab["resumed"] and second_ba["resumed"]
    assert second_ab["doc_write_failures"] == 0 and second_ba["doc_write_failures"] == 0
    assert second_ab["missing_found"] >= 3 and second_ba["missing_found"] >= 3
    assert_converged(a, b, ids)

    shared = a.doc(uid + "shared", conflicts=True)
    assert len(shared["_conflicts"]) == 1
    assert b.doc(uid + "shared", conflicts=True)["_conflicts"] == shared["_conflicts"]
    for side in (a, b):
        assert side.get(quote_id(uid + "a2")).status_code == 404
        assert side.get(quote_id(uid + "gone")).status_code == 404
        stubs = side.doc(uid + "a3")["_attachments"]
        assert stubs["photo.bin"]["digest"] == md5_digest(PHOTO) and stubs["photo.bin"]["revpos"] == 1
        assert stubs["extra.bin"]["digest"] == md5_digest(b"extra bytes") and stubs["extra.bin"]["revpos"] == 2
        assert side.request("GET", side.doc_url(uid + "a3", "note.txt")).content == NOTE

    # Nothing new: both directions resume from their checkpoints and write nothing.
    third_ab, third_ba = both_ways(a, b)
    for stats in (third_ab, third_ba):
        assert stats["resumed"]
        assert stats["missing_found"] == 0 and stats["docs_written"] == 0 and stats["docs_read"] == 0
    again = replicate(a, b)
    assert again["missing_checked"] == 0 and again["start_seq"] == third_ab["last_seq"]


def test_open_revs_fallback_replicates_like_bulk_get(server, server_b, uid):
    a, b = server, server_b
    a.create(uid + "f1", {"v": 1, "_attachments": {"f.bin": {"content_type": "application/octet-stream",
                                                              "data": b64(PHOTO[:5000])}}})
    base = a.doc(uid + "f1")
    a.update(uid + "f1", base["_rev"], dict(base, v=2))
    stats = Replicator(a, b, use_bulk_get=False).run()
    assert stats["open_revs_used"] and not stats["bulk_get_used"]
    assert stats["doc_write_failures"] == 0
    assert_converged(a, b, [uid + "f1"])
    assert b.doc(uid + "f1", revs=True)["_revisions"]["start"] == 2


def test_checkpoints_are_local_on_both_sides_and_never_in_changes(server, server_b, uid):
    a, b = server, server_b
    a.create(uid + "c1", {})
    rep = Replicator(a, b)
    stats = rep.run()
    for side in (a, b):
        r = side.request("GET", side.doc_url(rep.checkpoint_id), headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        log = r.json()
        assert log["session_id"] == rep.session_id
        assert str(log["source_last_seq"]) == str(stats["last_seq"])
        assert log["history"][0]["session_id"] == rep.session_id
        assert log["history"][0]["recorded_seq"] == log["source_last_seq"]
        changes = side.changes(since=0, style="all_docs")["results"]
        assert not any(row["id"].startswith("_local/") for row in changes)
        rows = side.get("_all_docs").json()["rows"]
        assert not any(row["id"].startswith("_local/") for row in rows)
    # A changed checkpoint on one side only (another session) falls back to the history.
    target_log = b.request("GET", b.doc_url(rep.checkpoint_id)).json()
    target_log["session_id"] = "another-session"
    assert b.request("PUT", b.doc_url(rep.checkpoint_id), json=target_log).status_code == 201
    resumed = Replicator(a, b).run()
    assert resumed["resumed"] and str(resumed["start_seq"]) == str(stats["last_seq"])
    assert resumed["docs_written"] == 0

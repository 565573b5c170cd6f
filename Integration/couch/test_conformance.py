"""Conformance of a server's CouchDB HTTP API with the CouchDB 3.x API reference and the
Replication Protocol, over plain HTTP. Expected values are what Apache CouchDB 3.x returns;
where a Ferry node may legitimately differ (vendor, the form of sequences, views) the tests
assert only what clients and replicators rely on."""

import base64
import gzip
import json
import threading
import time
import zlib

import pytest
import requests

from couchhttp import (
    b64, build_related, couch_error, encode_params, fake_rev, jq, md5_digest, parse_multipart,
    parse_related_document, quote_id, rev_generation, rev_hash,
)


def is_seq(value):
    """A sequence as CouchDB clients accept it: a number or an opaque string."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def seq_param(value):
    return value if isinstance(value, str) else str(value)


# MARK: server

class TestServer:
    def test_welcome_names_couchdb_version_and_vendor(self, couch):
        r = couch.request("GET", couch.base, auth=False)
        assert r.status_code == 200
        body = r.json()
        assert body["couchdb"] == "Welcome"
        assert isinstance(body["version"], str) and body["version"][0].isdigit()
        assert isinstance(body["vendor"], dict) and isinstance(body["vendor"].get("name"), str)
        assert r.headers["Content-Type"].startswith("application/json")

    def test_up_answers_ok_without_credentials(self, couch):
        r = couch.request("GET", couch.base + "_up", auth=False)
        assert r.status_code == 200
        assert r.json()["status"] == "ok"

    def test_all_dbs_lists_the_database(self, couch):
        r = couch.request("GET", couch.base + "_all_dbs")
        assert r.status_code == 200
        assert couch.db in r.json()

    def test_database_info_has_the_fields_clients_read(self, couch):
        r = couch.get()
        assert r.status_code == 200
        info = r.json()
        assert info["db_name"] == couch.db
        assert isinstance(info["doc_count"], int) and isinstance(info["doc_del_count"], int)
        assert is_seq(info["update_seq"])
        assert isinstance(info["instance_start_time"], str)
        assert isinstance(info.get("sizes", {}), dict)

    def test_head_database_is_200_without_a_body(self, couch):
        r = couch.request("HEAD", couch.db_url)
        assert r.status_code == 200
        assert r.content == b""

    def test_put_of_the_existing_database_is_412_file_exists(self, couch):
        r = couch.request("PUT", couch.db_url)
        assert r.status_code == 412
        assert couch_error(r)[0] == "file_exists"

    def test_a_missing_database_is_404_not_found(self, couch):
        r = couch.request("GET", couch.base + "no-such-db-" + couch.db)
        assert r.status_code == 404
        assert couch_error(r)[0] == "not_found"

    def test_database_requires_credentials(self, couch):
        r = couch.request("GET", couch.db_url, auth=False)
        assert r.status_code == 401
        assert couch_error(r)[0] == "unauthorized"

    def test_writes_require_credentials(self, couch, uid):
        r = couch.request("PUT", couch.doc_url(uid + "anon"), auth=False, json={"a": 1})
        assert r.status_code == 401
        assert couch_error(r)[0] == "unauthorized"
        assert couch.get(quote_id(uid + "anon")).status_code == 404

    def test_wrong_password_is_401(self, couch):
        r = requests.get(couch.db_url, auth=(couch.user, couch.password + "x"), timeout=30)
        assert r.status_code == 401
        assert couch_error(r)[0] == "unauthorized"

    def test_session_cookie_from_form_credentials_authenticates(self, couch):
        # CouchDB's replicator logs in this way with the credentials in a peer's URL.
        r = couch.request("POST", couch.base + "_session", auth=False,
                          data={"name": couch.user, "password": couch.password})
        assert r.status_code == 200, r.text
        assert r.json()["ok"] is True
        cookie = r.cookies.get("AuthSession")
        assert cookie
        r = couch.request("GET", couch.db_url, auth=False, cookies={"AuthSession": cookie})
        assert r.status_code == 200
        r = couch.request("POST", couch.base + "_session", auth=False,
                          data={"name": couch.user, "password": couch.password + "-wrong"})
        assert r.status_code == 401
        assert couch_error(r)[0] == "unauthorized"

    def test_ensure_full_commit_is_201_with_instance_start_time(self, couch):
        r = couch.post("_ensure_full_commit", headers={"Content-Type": "application/json"})
        assert r.status_code == 201
        body = r.json()
        assert body["ok"] is True
        assert isinstance(body["instance_start_time"], str)

    def test_revs_limit_is_a_positive_integer(self, couch):
        r = couch.get("_revs_limit")
        assert r.status_code == 200
        assert isinstance(r.json(), int) and r.json() > 0


# MARK: documents

class TestDocuments:
    def test_put_get_update_delete_round_trip(self, couch, uid):
        doc_id = uid + "doc"
        r = couch.request("PUT", couch.doc_url(doc_id), json={"n": 1, "nested": {"list": [1, "two", None, True]}})
        assert r.status_code == 201
        created = r.json()
        assert created["ok"] is True and created["id"] == doc_id
        rev1 = created["rev"]
        assert rev_generation(rev1) == 1
        assert r.headers.get("ETag", "").strip('"') == rev1

        got = couch.doc(doc_id)
        assert got == {"_id": doc_id, "_rev": rev1, "n": 1, "nested": {"list": [1, "two", None, True]}}

        rev2 = couch.update(doc_id, rev1, {"n": 2})
        assert rev_generation(rev2) == 2
        assert couch.doc(doc_id)["n"] == 2
        assert couch.doc(doc_id, rev=rev1)["n"] == 1

        r = couch.request("DELETE", couch.doc_url(doc_id), params={"rev": rev2})
        assert r.status_code == 200
        rev3 = r.json()["rev"]
        assert r.json()["ok"] is True and rev_generation(rev3) == 3
        r = couch.get(quote_id(doc_id))
        assert r.status_code == 404
        assert couch_error(r) == ("not_found", "deleted")
        tomb = couch.doc(doc_id, rev=rev3)
        assert tomb["_deleted"] is True and tomb["_rev"] == rev3

    def test_head_document_answers_etag_of_current_revision(self, couch, uid):
        rev = couch.create(uid + "h", {"a": 1})
        r = couch.request("HEAD", couch.doc_url(uid + "h"))
        assert r.status_code == 200
        assert r.headers["ETag"].strip('"') == rev
        assert r.content == b""
        assert couch.request("HEAD", couch.doc_url(uid + "nothing")).status_code == 404

    def test_missing_document_is_404_missing(self, couch, uid):
        r = couch.get(quote_id(uid + "never"))
        assert r.status_code == 404
        assert couch_error(r) == ("not_found", "missing")

    def test_update_without_current_rev_is_409_conflict(self, couch, uid):
        couch.create(uid + "c", {"v": 1})
        r = couch.put(quote_id(uid + "c"), {"v": 2})
        assert r.status_code == 409
        assert r.json() == {"error": "conflict", "reason": "Document update conflict."}
        r = couch.put(quote_id(uid + "c"), {"v": 2, "_rev": fake_rev(1, "stale")})
        assert r.status_code == 409
        assert couch_error(r)[0] == "conflict"
        assert couch.doc(uid + "c")["v"] == 1

    def test_rev_in_query_or_if_match_updates(self, couch, uid):
        rev = couch.create(uid + "q", {"v": 1})
        r = couch.put(quote_id(uid + "q"), {"v": 2}, params={"rev": rev})
        assert r.status_code == 201
        rev2 = r.json()["rev"]
        r = couch.put(quote_id(uid + "q"), {"v": 3}, headers={"If-Match": rev2})
        assert r.status_code == 201
        assert couch.doc(uid + "q")["v"] == 3

    def test_post_creates_a_document_with_a_generated_id(self, couch, uid):
        r = couch.post("", {"made": uid})
        assert r.status_code == 201
        body = r.json()
        assert body["ok"] is True and isinstance(body["id"], str) and body["id"]
        assert couch.doc(body["id"])["made"] == uid
        r = couch.post("", {"_id": uid + "posted", "x": 1})
        assert r.status_code == 201 and r.json()["id"] == uid + "posted"

    def test_invalid_json_is_400_bad_request(self, couch, uid):
        r = couch.request("PUT", couch.doc_url(uid + "bad"), data=b"{not json",
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"
        assert couch.get(quote_id(uid + "bad")).status_code == 404

    def test_a_non_object_body_is_400(self, couch, uid):
        r = couch.request("PUT", couch.doc_url(uid + "arr"), json=[1, 2])
        assert r.status_code == 400
        assert couch_error(r)[0] in ("bad_request", "doc_validation")

    def test_malformed_rev_is_400_bad_request(self, couch, uid):
        couch.create(uid + "r", {})
        r = couch.get(quote_id(uid + "r"), params={"rev": "garbage"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"
        r = couch.put(quote_id(uid + "r"), {"_rev": "x-y"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"

    def test_top_level_underscore_field_is_doc_validation(self, couch, uid):
        r = couch.put(quote_id(uid + "u"), {"_foo": 1, "ok": True})
        assert r.status_code == 400
        error, reason = couch_error(r)
        assert error == "doc_validation"
        assert "_foo" in reason
        assert couch.get(quote_id(uid + "u")).status_code == 404

    def test_reserved_read_only_fields_are_not_stored(self, couch, uid):
        body = {"v": 1, "_conflicts": ["1-abc"], "_deleted_conflicts": ["1-abc"], "_revs_info": [],
                "_local_seq": 5}
        r = couch.put(quote_id(uid + "ro"), body)
        assert r.status_code == 201, r.text
        doc = couch.doc(uid + "ro")
        assert doc == {"_id": uid + "ro", "_rev": r.json()["rev"], "v": 1}

    def test_design_documents_are_stored_and_served_as_documents(self, couch, uid):
        ddoc = "_design/" + uid + "x"
        r = couch.request("PUT", couch.doc_url(ddoc), json={"note": "kept", "options": {}})
        assert r.status_code == 201, r.text
        assert r.json()["id"] == ddoc
        got = couch.doc(ddoc)
        assert got["_id"] == ddoc and got["note"] == "kept"
        rows = couch.get("_all_docs", params={"key": jq(ddoc)}).json()["rows"]
        assert [row["id"] for row in rows] == [ddoc]
        # An escaped slash names the same document (CouchDB answers with a redirect).
        r = couch.get("_design%2F" + uid + "x", headers={"Accept": "application/json"})
        assert r.status_code == 200 and r.json()["_id"] == ddoc

    def test_unicode_and_escaped_ids_round_trip(self, couch, uid):
        doc_id = uid + "ü ñ/+?&%"
        rev = couch.create(doc_id, {"s": "héllo \u2603"})
        got = couch.doc(doc_id)
        assert got["_id"] == doc_id and got["_rev"] == rev and got["s"] == "héllo \u2603"

    def test_gzip_request_bodies_are_accepted(self, couch, uid):
        # IBM's Cloudant SDK sends every request body gzip-compressed.
        body = gzip.compress(json.dumps({"zipped": True}).encode())
        r = couch.request("PUT", couch.doc_url(uid + "gz"), data=body,
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text
        assert couch.doc(uid + "gz")["zipped"] is True
        bulk = gzip.compress(json.dumps({"docs": [{"_id": uid + "gz2", "n": 2}]}).encode())
        r = couch.request("POST", couch.url("_bulk_docs"), data=bulk,
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text
        assert couch.doc(uid + "gz2")["n"] == 2

    def test_body_over_the_size_limit_is_413(self, couch, uid):
        big = {"blob": "x" * (9 * 1024 * 1024)}
        r = couch.put(quote_id(uid + "big"), big)
        assert r.status_code == 413
        assert couch_error(r)[0] in ("too_large", "document_too_large", "request_entity_too_large")
        assert couch.get(quote_id(uid + "big")).status_code == 404


class TestReadOptions:
    """rev, revs, revs_info, open_revs, latest, conflicts, deleted_conflicts."""

    def _tree(self, couch, doc_id):
        """A document with branches: 1-a ← 2-b ← 3-c (winner), 1-a ← 2-d (conflict),
        1-a ← 2-e ← 3-f deleted. Returns the revision IDs."""
        a, b, c = fake_rev(1, doc_id + "a"), fake_rev(2, doc_id + "b"), fake_rev(3, doc_id + "c")
        d = fake_rev(2, doc_id + "d")
        e, f = fake_rev(2, doc_id + "e"), fake_rev(3, doc_id + "f")
        couch.store_history(doc_id, [c, b, a], {"branch": "c"})
        couch.store_history(doc_id, [d, a], {"branch": "d"})
        couch.store_history(doc_id, [f, e, a], {"branch": "f"}, deleted=True)
        return dict(a=a, b=b, c=c, d=d, e=e, f=f)

    def test_revs_returns_the_revision_history(self, couch, uid):
        t = self._tree(couch, uid + "t")
        doc = couch.doc(uid + "t", revs=True)
        assert doc["_rev"] == t["c"]
        assert doc["_revisions"] == {"start": 3, "ids": [rev_hash(t["c"]), rev_hash(t["b"]), rev_hash(t["a"])]}

    def test_revs_info_lists_history_with_status(self, couch, uid):
        t = self._tree(couch, uid + "t")
        info = couch.doc(uid + "t", revs_info=True)["_revs_info"]
        assert [i["rev"] for i in info] == [t["c"], t["b"], t["a"]]
        assert info[0]["status"] == "available"
        assert all(i["status"] in ("available", "missing", "deleted") for i in info)

    def test_conflicts_lists_live_losing_leaves_only(self, couch, uid):
        t = self._tree(couch, uid + "t")
        doc = couch.doc(uid + "t", conflicts=True)
        assert doc["_rev"] == t["c"] and doc["branch"] == "c"
        assert doc["_conflicts"] == [t["d"]]
        assert "_conflicts" not in couch.doc(uid + "t")

    def test_deleted_conflicts_lists_deleted_leaves(self, couch, uid):
        t = self._tree(couch, uid + "t")
        doc = couch.doc(uid + "t", deleted_conflicts=True)
        assert doc["_deleted_conflicts"] == [t["f"]]

    def test_rev_of_a_non_leaf_with_a_body_is_served(self, couch, uid):
        rev1 = couch.create(uid + "old", {"v": 1})
        couch.update(uid + "old", rev1, {"v": 2})
        assert couch.doc(uid + "old", rev=rev1)["v"] == 1

    def test_unknown_rev_is_404(self, couch, uid):
        couch.create(uid + "x", {})
        r = couch.get(quote_id(uid + "x"), params={"rev": fake_rev(7, "nope")})
        assert r.status_code == 404
        assert couch_error(r)[0] == "not_found"

    def test_open_revs_all_returns_every_leaf(self, couch, uid):
        t = self._tree(couch, uid + "t")
        r = couch.get(quote_id(uid + "t"), params={"open_revs": "all"}, headers={"Accept": "application/json"})
        assert r.status_code == 200
        leaves = {item["ok"]["_rev"]: item["ok"] for item in r.json()}
        assert set(leaves) == {t["c"], t["d"], t["f"]}
        assert leaves[t["f"]].get("_deleted") is True
        assert leaves[t["d"]]["branch"] == "d"

    def test_open_revs_list_answers_ok_or_missing_per_rev(self, couch, uid):
        t = self._tree(couch, uid + "t")
        unknown = fake_rev(2, "unknown")
        r = couch.get(quote_id(uid + "t"), params={"open_revs": jq([t["d"], unknown]), "revs": "true"},
                      headers={"Accept": "application/json"})
        assert r.status_code == 200
        items = r.json()
        assert len(items) == 2
        ok = [i["ok"] for i in items if "ok" in i]
        assert [d["_rev"] for d in ok] == [t["d"]]
        assert ok[0]["_revisions"] == {"start": 2, "ids": [rev_hash(t["d"]), rev_hash(t["a"])]}
        assert [i["missing"] for i in items if "missing" in i] == [unknown]

    def test_open_revs_with_latest_returns_the_leaf_of_an_ancestor(self, couch, uid):
        t = self._tree(couch, uid + "t")
        r = couch.get(quote_id(uid + "t"), params={"open_revs": jq([t["b"]]), "latest": "true"},
                      headers={"Accept": "application/json"})
        assert r.status_code == 200
        assert [i["ok"]["_rev"] for i in r.json()] == [t["c"]]

    def test_open_revs_of_a_missing_document_lists_it_missing(self, couch, uid):
        rev = fake_rev(1, "ghost")
        r = couch.get(quote_id(uid + "ghost"), params={"open_revs": jq([rev])},
                      headers={"Accept": "application/json"})
        assert r.status_code == 200
        assert r.json() == [{"missing": rev}]

    def test_malformed_open_revs_is_400(self, couch, uid):
        couch.create(uid + "o", {})
        r = couch.get(quote_id(uid + "o"), params={"open_revs": "[not json"},
                      headers={"Accept": "application/json"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"


# MARK: bulk

class TestBulkDocs:
    def test_bulk_docs_creates_updates_and_deletes(self, couch, uid):
        result = couch.bulk_docs([{"_id": uid + "1", "v": 1}, {"_id": uid + "2", "v": 2}, {"v": 3}])
        assert [r["ok"] for r in result] == [True, True, True]
        assert [r["id"] for r in result[:2]] == [uid + "1", uid + "2"]
        rev1 = result[0]["rev"]
        result = couch.bulk_docs([{"_id": uid + "1", "_rev": rev1, "v": 10},
                                  {"_id": uid + "2", "_rev": result[1]["rev"], "_deleted": True}])
        assert all(r.get("ok") for r in result), result
        assert couch.doc(uid + "1")["v"] == 10
        assert couch.get(quote_id(uid + "2")).status_code == 404

    def test_one_conflicting_document_is_reported_and_the_others_stored(self, couch, uid):
        couch.create(uid + "exists", {"v": 1})
        r = couch.post("_bulk_docs", {"docs": [{"_id": uid + "a"}, {"_id": uid + "exists", "v": 2}, {"_id": uid + "b"}]})
        assert r.status_code == 201
        result = r.json()
        assert result[0]["ok"] is True and result[2]["ok"] is True
        assert result[1] == {"id": uid + "exists", "error": "conflict", "reason": "Document update conflict."}
        assert couch.doc(uid + "exists")["v"] == 1
        assert couch.get(quote_id(uid + "a")).status_code == 200
        assert couch.get(quote_id(uid + "b")).status_code == 200

    def test_an_invalid_document_in_a_batch_is_refused_and_nothing_of_it_stored(self, couch, uid):
        # CouchDB refuses the whole request (400 doc_validation); a per-document error with
        # the valid documents stored is the other behaviour a client can rely on.
        r = couch.post("_bulk_docs", {"docs": [{"_id": uid + "good"}, {"_id": uid + "bad", "_foo": 1}]})
        assert couch.get(quote_id(uid + "bad")).status_code == 404
        if r.status_code == 400:
            assert couch_error(r)[0] == "doc_validation"
        else:
            assert r.status_code == 201
            result = r.json()
            assert result[0].get("ok") is True
            assert result[1]["error"] == "doc_validation"
            assert couch.get(quote_id(uid + "good")).status_code == 200

    def test_new_edits_false_stores_the_given_history(self, couch, uid):
        a, b, c = fake_rev(1, uid + "a"), fake_rev(2, uid + "b"), fake_rev(3, uid + "c")
        r = couch.post("_bulk_docs", {"new_edits": False, "docs": [
            {"_id": uid + "h", "_rev": c, "v": "c", "_revisions": {"start": 3, "ids": [rev_hash(c), rev_hash(b), rev_hash(a)]}}]})
        assert r.status_code == 201
        assert r.json() == [] or all("error" not in x for x in r.json())
        doc = couch.doc(uid + "h", revs=True)
        assert doc["_rev"] == c and doc["v"] == "c"
        assert doc["_revisions"]["ids"] == [rev_hash(c), rev_hash(b), rev_hash(a)]

    def test_new_edits_false_makes_conflicts_and_the_couchdb_winner(self, couch, uid):
        base = fake_rev(1, uid + "base")
        low, high = sorted([fake_rev(2, uid + "x"), fake_rev(2, uid + "y")], key=rev_hash)
        couch.store_history(uid + "w", [base])
        couch.store_history(uid + "w", [low, base], {"side": "low"})
        couch.store_history(uid + "w", [high, base], {"side": "high"})
        doc = couch.doc(uid + "w", conflicts=True)
        # Same generation: the higher revision hash wins.
        assert doc["_rev"] == high and doc["side"] == "high"
        assert doc["_conflicts"] == [low]
        # A longer branch wins over a higher hash; a deleted leaf never beats a live one.
        longer = fake_rev(3, uid + "z")
        couch.store_history(uid + "w", [longer, low, base], {"side": "longer"})
        assert couch.doc(uid + "w")["_rev"] == longer
        tomb = fake_rev(4, uid + "t")
        couch.store_history(uid + "w", [tomb, longer, low, base], deleted=True)
        doc = couch.doc(uid + "w", conflicts=True, deleted_conflicts=True)
        assert doc["_rev"] == high
        assert doc["_deleted_conflicts"] == [tomb]

    def test_new_edits_false_without_revisions_uses_the_rev(self, couch, uid):
        rev = fake_rev(1, uid + "plain")
        result = couch.bulk_docs([{"_id": uid + "p", "_rev": rev, "v": 1}], new_edits=False)
        assert all("error" not in x for x in result)
        assert couch.doc(uid + "p")["_rev"] == rev

    def test_new_edits_false_twice_is_idempotent(self, couch, uid):
        rev = fake_rev(1, uid + "idem")
        for _ in range(2):
            couch.bulk_docs([{"_id": uid + "i", "_rev": rev, "v": 1}], new_edits=False)
        r = couch.get(quote_id(uid + "i"), params={"open_revs": "all"}, headers={"Accept": "application/json"})
        assert [x["ok"]["_rev"] for x in r.json()] == [rev]

    def test_wrong_content_type_is_415(self, couch, uid):
        r = couch.post("_bulk_docs", data=json.dumps({"docs": [{"_id": uid + "ct"}]}),
                       headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        assert couch_error(r)[0] == "bad_content_type"
        assert couch.get(quote_id(uid + "ct")).status_code == 404

    def test_missing_docs_member_is_400(self, couch):
        r = couch.post("_bulk_docs", {"nodocs": []})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"

    def test_bad_revisions_history_is_refused(self, couch, uid):
        rev = fake_rev(3, uid + "bad")
        r = couch.post("_bulk_docs", {"new_edits": False, "docs": [
            {"_id": uid + "br", "_rev": rev, "_revisions": {"start": "x", "ids": "nope"}}]})
        assert r.status_code in (400, 201)
        if r.status_code == 201:
            assert r.json()[0].get("error")
        assert couch.get(quote_id(uid + "br")).status_code == 404


class TestBulkGet:
    def test_bulk_get_returns_docs_with_revisions(self, couch, uid):
        rev1 = couch.create(uid + "g", {"v": 1})
        rev2 = couch.update(uid + "g", rev1, {"v": 2})
        r = couch.post("_bulk_get", {"docs": [{"id": uid + "g", "rev": rev1}, {"id": uid + "g"}]}, params={"revs": "true"})
        assert r.status_code == 200
        results = r.json()["results"]
        assert [x["id"] for x in results] == [uid + "g", uid + "g"]
        first = results[0]["docs"][0]["ok"]
        assert first["_rev"] == rev1 and first["v"] == 1
        assert first["_revisions"]["start"] == 1
        second = results[1]["docs"][0]["ok"]
        assert second["_rev"] == rev2
        assert second["_revisions"]["ids"] == [rev_hash(rev2), rev_hash(rev1)]

    def test_bulk_get_reports_missing_documents_and_revisions(self, couch, uid):
        couch.create(uid + "present", {})
        missing_rev = fake_rev(5, "missing")
        r = couch.post("_bulk_get", {"docs": [{"id": uid + "absent"}, {"id": uid + "present", "rev": missing_rev}]})
        assert r.status_code == 200
        results = r.json()["results"]
        err0 = results[0]["docs"][0]["error"]
        assert err0["id"] == uid + "absent" and err0["error"] == "not_found"
        err1 = results[1]["docs"][0]["error"]
        assert err1["id"] == uid + "present" and err1["rev"] == missing_rev and err1["error"] == "not_found"

    def test_bulk_get_latest_returns_the_leaf(self, couch, uid):
        rev1 = couch.create(uid + "l", {"v": 1})
        rev2 = couch.update(uid + "l", rev1, {"v": 2})
        r = couch.post("_bulk_get", {"docs": [{"id": uid + "l", "rev": rev1}]}, params={"latest": "true"})
        assert r.json()["results"][0]["docs"][0]["ok"]["_rev"] == rev2

    def test_bulk_get_attachments_inline_base64(self, couch, uid):
        data = b"bulk get bytes \x00\xff"
        rev = couch.create(uid + "a", {"_attachments": {"f.bin": {"content_type": "application/octet-stream", "data": b64(data)}}})
        r = couch.post("_bulk_get", {"docs": [{"id": uid + "a", "rev": rev}]},
                       params={"attachments": "true", "revs": "true"})
        doc = r.json()["results"][0]["docs"][0]["ok"]
        att = doc["_attachments"]["f.bin"]
        assert base64.b64decode(att["data"]) == data
        assert att["digest"] == md5_digest(data)
        assert "stub" not in att

    def test_bulk_get_without_docs_is_400(self, couch):
        r = couch.post("_bulk_get", {"nodocs": []})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"


class TestRevsDiff:
    def test_revs_diff_names_missing_revisions_and_possible_ancestors(self, couch, uid):
        rev1 = couch.create(uid + "d", {"v": 1})
        rev2 = couch.update(uid + "d", rev1, {"v": 2})
        new3, new4 = fake_rev(3, uid + "n3"), fake_rev(4, uid + "n4")
        r = couch.post("_revs_diff", {uid + "d": [rev1, rev2, new3, new4], uid + "none": [fake_rev(1, "z")],
                                      uid + "have": []})
        assert r.status_code == 200
        body = r.json()
        assert sorted(body[uid + "d"]["missing"]) == sorted([new3, new4])
        assert rev2 in body[uid + "d"]["possible_ancestors"]
        assert rev1 not in body[uid + "d"].get("possible_ancestors", [])
        assert body[uid + "none"]["missing"] == [fake_rev(1, "z")]
        assert "possible_ancestors" not in body[uid + "none"]
        assert uid + "have" not in body

    def test_revs_diff_omits_documents_with_nothing_missing(self, couch, uid):
        rev = couch.create(uid + "all", {})
        r = couch.post("_revs_diff", {uid + "all": [rev]})
        assert r.status_code == 200 and r.json() == {}

    def test_revs_diff_of_a_non_object_is_400(self, couch):
        r = couch.post("_revs_diff", [1, 2])
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"


# MARK: all_docs

class TestAllDocs:
    def _fill(self, couch, uid):
        ids = [uid + c for c in "abcde"]
        couch.bulk_docs([{"_id": i, "v": n} for n, i in enumerate(ids)])
        return ids

    def _range(self, uid):
        return {"startkey": jq(uid), "endkey": jq(uid + "\ufff0")}

    def test_all_docs_lists_ids_keys_and_revs_in_order(self, couch, uid):
        ids = self._fill(couch, uid)
        r = couch.get("_all_docs", params=self._range(uid))
        assert r.status_code == 200
        body = r.json()
        assert isinstance(body["total_rows"], int) and body["total_rows"] >= 5
        assert "offset" in body
        assert [row["id"] for row in body["rows"]] == ids
        assert all(row["key"] == row["id"] and row["value"]["rev"].startswith("1-") for row in body["rows"])

    def test_limit_skip_and_descending(self, couch, uid):
        ids = self._fill(couch, uid)
        rows = couch.get("_all_docs", params=dict(self._range(uid), limit=2, skip=1)).json()["rows"]
        assert [row["id"] for row in rows] == ids[1:3]
        rows = couch.get("_all_docs", params={"startkey": jq(uid + "\ufff0"), "endkey": jq(uid),
                                              "descending": "true"}).json()["rows"]
        assert [row["id"] for row in rows] == list(reversed(ids))

    def test_inclusive_end_false_excludes_the_endkey(self, couch, uid):
        ids = self._fill(couch, uid)
        rows = couch.get("_all_docs", params={"startkey": jq(ids[1]), "endkey": jq(ids[3]),
                                              "inclusive_end": "false"}).json()["rows"]
        assert [row["id"] for row in rows] == ids[1:3]

    def test_include_docs_adds_bodies(self, couch, uid):
        ids = self._fill(couch, uid)
        rows = couch.get("_all_docs", params=dict(self._range(uid), include_docs="true")).json()["rows"]
        assert [row["doc"]["v"] for row in rows] == [0, 1, 2, 3, 4]
        assert rows[0]["doc"]["_id"] == ids[0]

    def test_keys_answers_rows_in_key_order_with_missing_and_deleted(self, couch, uid):
        ids = self._fill(couch, uid)
        rev = couch.doc(ids[1])["_rev"]
        couch.remove(ids[1], rev)
        r = couch.post("_all_docs", {"keys": [ids[3], uid + "zzz", ids[1], ids[0]]}, params={"include_docs": "true"})
        assert r.status_code == 200
        rows = r.json()["rows"]
        assert rows[0]["id"] == ids[3] and rows[0]["doc"]["v"] == 3
        assert rows[1] == {"key": uid + "zzz", "error": "not_found"}
        assert rows[2]["id"] == ids[1] and rows[2]["value"]["deleted"] is True and rows[2]["doc"] is None
        assert rows[3]["id"] == ids[0]

    def test_keys_as_get_parameter(self, couch, uid):
        ids = self._fill(couch, uid)
        rows = couch.get("_all_docs", params={"keys": jq([ids[4], ids[2]])}).json()["rows"]
        assert [row["id"] for row in rows] == [ids[4], ids[2]]

    def test_deleted_documents_are_not_listed(self, couch, uid):
        ids = self._fill(couch, uid)
        couch.remove(ids[2], couch.doc(ids[2])["_rev"])
        rows = couch.get("_all_docs", params=self._range(uid)).json()["rows"]
        assert [row["id"] for row in rows] == ids[:2] + ids[3:]

    def test_bad_startkey_json_is_400(self, couch):
        r = couch.get("_all_docs", params={"startkey": "not-json"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"

    def test_bad_limit_is_400(self, couch):
        r = couch.get("_all_docs", params={"limit": "many"})
        assert r.status_code == 400
        assert couch_error(r)[0] in ("query_parse_error", "bad_request")


# MARK: changes

def _ids(results):
    return [row["id"] for row in results]


class TestChanges:
    def test_normal_feed_since_a_seq_lists_changes_in_order(self, couch, uid):
        since = couch.update_seq()
        couch.bulk_docs([{"_id": uid + "1"}, {"_id": uid + "2"}])
        rev = couch.create(uid + "3", {})
        couch.remove(uid + "3", rev)
        body = couch.changes(since=seq_param(since))
        mine = [row for row in body["results"] if row["id"].startswith(uid)]
        assert _ids(mine) == [uid + "1", uid + "2", uid + "3"]
        assert mine[2]["deleted"] is True
        assert all(is_seq(row["seq"]) and row["changes"][0]["rev"] for row in mine)
        assert is_seq(body["last_seq"])
        assert isinstance(body.get("pending", 0), int)

    def test_since_zero_includes_everything(self, couch, uid):
        couch.create(uid + "zero", {})
        body = couch.changes(since=0)
        assert uid + "zero" in _ids(body["results"])

    def test_since_now_returns_no_results_and_the_current_seq(self, couch, uid):
        couch.create(uid + "before", {})
        body = couch.changes(since="now")
        assert body["results"] == []
        assert is_seq(body["last_seq"])
        couch.create(uid + "after", {})
        later = couch.changes(since=seq_param(body["last_seq"]))
        assert _ids(later["results"]) == [uid + "after"]

    def test_seqs_from_info_and_changes_work_as_since_also_as_strings(self, couch, uid):
        seq = couch.info()["update_seq"]
        couch.create(uid + "s1", {})
        assert _ids(couch.changes(since=str(seq) if not isinstance(seq, str) else seq)["results"]) == [uid + "s1"]
        row_seq = couch.changes(since=seq_param(seq))["results"][0]["seq"]
        couch.create(uid + "s2", {})
        assert _ids(couch.changes(since=seq_param(row_seq))["results"]) == [uid + "s2"]
        r = couch.post("_changes", {}, params={"since": seq_param(row_seq)})
        assert _ids(r.json()["results"]) == [uid + "s2"]

    def test_limit_and_last_seq_page_through(self, couch, uid):
        since = couch.update_seq()
        couch.bulk_docs([{"_id": uid + str(i)} for i in range(5)])
        seen = []
        for _ in range(10):
            body = couch.changes(since=seq_param(since), limit=2)
            assert len(body["results"]) <= 2
            if not body["results"]:
                break
            seen += _ids(body["results"])
            since = body["last_seq"]
        assert seen == [uid + str(i) for i in range(5)]

    def test_a_document_appears_once_at_its_latest_change(self, couch, uid):
        since = couch.update_seq()
        rev = couch.create(uid + "a", {"v": 1})
        couch.create(uid + "b", {})
        couch.update(uid + "a", rev, {"v": 2})
        body = couch.changes(since=seq_param(since))
        assert _ids(body["results"]) == [uid + "b", uid + "a"]
        assert body["results"][1]["changes"][0]["rev"].startswith("2-")

    def test_descending_reverses_the_order(self, couch, uid):
        since = couch.update_seq()
        couch.create(uid + "1", {})
        couch.create(uid + "2", {})
        rows = couch.changes(descending=True, limit=2)["results"]
        assert _ids(rows) == [uid + "2", uid + "1"]
        normal = couch.changes(since=seq_param(since))["results"]
        assert _ids(normal) == [uid + "1", uid + "2"]

    def test_style_all_docs_lists_every_leaf(self, couch, uid):
        since = couch.update_seq()
        base = fake_rev(1, uid + "b")
        x, y = fake_rev(2, uid + "x"), fake_rev(2, uid + "y")
        couch.store_history(uid + "c", [x, base])
        couch.store_history(uid + "c", [y, base])
        rows = couch.changes(since=seq_param(since), style="all_docs")["results"]
        assert sorted(c["rev"] for c in rows[0]["changes"]) == sorted([x, y])
        rows = couch.changes(since=seq_param(since))["results"]
        assert [c["rev"] for c in rows[0]["changes"]] == [max(x, y, key=rev_hash)]

    def test_include_docs_and_conflicts(self, couch, uid):
        since = couch.update_seq()
        base = fake_rev(1, uid + "b")
        x, y = sorted([fake_rev(2, uid + "x"), fake_rev(2, uid + "y")], key=rev_hash)
        couch.store_history(uid + "c", [x, base], {"side": "x"})
        couch.store_history(uid + "c", [y, base], {"side": "y"})
        rows = couch.changes(since=seq_param(since), include_docs=True, conflicts=True)["results"]
        assert rows[0]["doc"]["_rev"] == y and rows[0]["doc"]["side"] == "y"
        assert rows[0]["doc"]["_conflicts"] == [x]
        deleted_since = couch.update_seq()
        couch.store_history(uid + "d", [fake_rev(1, uid + "d")], deleted=True)
        rows = couch.changes(since=seq_param(deleted_since), include_docs=True)["results"]
        assert rows[0]["deleted"] is True and rows[0]["doc"]["_deleted"] is True

    def test_doc_ids_filter_by_get_and_post(self, couch, uid):
        since = couch.update_seq()
        couch.bulk_docs([{"_id": uid + n} for n in "abc"])
        body = couch.changes(since=seq_param(since), filter="_doc_ids", doc_ids=[uid + "c", uid + "a"])
        assert _ids(body["results"]) == [uid + "a", uid + "c"]
        r = couch.post("_changes", {"doc_ids": [uid + "b"]}, params={"filter": "_doc_ids", "since": seq_param(since)})
        assert r.status_code == 200
        assert _ids(r.json()["results"]) == [uid + "b"]

    def test_selector_filter(self, couch, uid):
        since = couch.update_seq()
        couch.bulk_docs([{"_id": uid + "1", "type": "fruit", "n": 1}, {"_id": uid + "2", "type": "veg", "n": 2},
                         {"_id": uid + "3", "type": "fruit", "n": 5}])
        r = couch.post("_changes", {"selector": {"type": "fruit", "n": {"$gt": 2}}},
                       params={"filter": "_selector", "since": seq_param(since)})
        assert r.status_code == 200, r.text
        assert _ids(r.json()["results"]) == [uid + "3"]

    def test_selector_filter_without_selector_is_400(self, couch):
        r = couch.post("_changes", {}, params={"filter": "_selector"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"

    def test_unknown_feed_is_400(self, couch):
        r = couch.get("_changes", params={"feed": "sideways"})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"

    def test_local_documents_are_not_in_changes_or_all_docs(self, couch, uid):
        since = couch.update_seq()
        r = couch.request("PUT", couch.doc_url("_local/" + uid + "cp"), json={"x": 1})
        assert r.status_code == 201
        couch.create(uid + "visible", {})
        assert _ids(couch.changes(since=seq_param(since))["results"]) == [uid + "visible"]
        rows = couch.get("_all_docs", params={"startkey": jq("_local/"), "endkey": jq("_local/\ufff0")}).json()["rows"]
        assert not any(uid in row["id"] for row in rows)
        rows = couch.get("_all_docs", params={"startkey": jq(uid), "endkey": jq(uid + "\ufff0")}).json()["rows"]
        assert [row["id"] for row in rows] == [uid + "visible"]

    def test_longpoll_since_now_waits_for_the_next_change(self, couch, uid):
        now = couch.changes(since="now")["last_seq"]
        result = {}

        def poll():
            result["r"] = couch.get("_changes", params={"feed": "longpoll", "since": seq_param(now), "timeout": 30000})

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.5)
        couch.create(uid + "lp", {})
        t.join(40)
        r = result["r"]
        assert r.status_code == 200
        body = r.json()
        assert uid + "lp" in _ids(body["results"])
        assert is_seq(body["last_seq"])

    def test_longpoll_with_changes_pending_answers_at_once(self, couch, uid):
        since = couch.update_seq()
        couch.create(uid + "now", {})
        r = couch.get("_changes", params={"feed": "longpoll", "since": seq_param(since), "timeout": 60000})
        assert _ids(r.json()["results"]) == [uid + "now"]

    def test_longpoll_timeout_answers_empty(self, couch):
        r = couch.get("_changes", params={"feed": "longpoll", "since": "now", "timeout": 300})
        assert r.status_code == 200
        assert r.json()["results"] == []

    def test_continuous_feed_streams_lines_and_ends_with_last_seq(self, couch, uid):
        since = couch.update_seq()
        couch.bulk_docs([{"_id": uid + "1"}, {"_id": uid + "2"}])
        r = couch.get("_changes", params={"feed": "continuous", "since": seq_param(since), "timeout": 500})
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
        changes, last = lines[:-1], lines[-1]
        assert _ids(changes) == [uid + "1", uid + "2"]
        assert is_seq(last["last_seq"])

    def test_continuous_feed_delivers_later_changes(self, couch, uid):
        now = couch.changes(since="now")["last_seq"]
        r = couch.get("_changes", params={"feed": "continuous", "since": seq_param(now), "timeout": 20000},
                      stream=True)
        assert r.status_code == 200
        couch.create(uid + "live", {})
        found = None
        deadline = time.monotonic() + 20
        for line in r.iter_lines():
            if line.strip():
                row = json.loads(line)
                if row.get("id") == uid + "live":
                    found = row
                    break
            if time.monotonic() > deadline:
                break
        r.close()
        assert found is not None and found["changes"][0]["rev"].startswith("1-")

    def test_continuous_heartbeat_sends_newlines_while_idle(self, couch):
        r = couch.get("_changes", params={"feed": "continuous", "since": "now", "heartbeat": 200}, stream=True)
        assert r.status_code == 200
        received = b""
        deadline = time.monotonic() + 15
        for chunk in r.iter_content(chunk_size=1):
            received += chunk
            if received.count(b"\n") >= 2 or time.monotonic() > deadline:
                break
        r.close()
        assert received.strip() == b"" and received.count(b"\n") >= 2

    def test_eventsource_feed_sends_data_and_id_events(self, couch, uid):
        since = couch.update_seq()
        couch.create(uid + "es", {})
        r = couch.get("_changes", params={"feed": "eventsource", "since": seq_param(since), "timeout": 500})
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [e for e in r.text.split("\n\n") if e.strip()]
        data = []
        for event in events:
            fields = dict(line.split(": ", 1) for line in event.splitlines() if ": " in line)
            if "data" in fields:
                payload = json.loads(fields["data"])
                if "id" in payload:
                    data.append(payload)
                    assert "id" in fields
        assert _ids(data) == [uid + "es"]


# MARK: local documents

class TestLocal:
    def test_local_put_get_update_delete(self, couch, uid):
        path = couch.doc_url("_local/" + uid + "ck")
        r = couch.request("PUT", path, json={"history": [1, 2], "n": 1})
        assert r.status_code == 201
        body = r.json()
        assert body["ok"] is True and body["id"] == "_local/" + uid + "ck"
        rev = body["rev"]
        assert rev.startswith("0-")
        got = couch.request("GET", path).json()
        assert got["_id"] == "_local/" + uid + "ck" and got["_rev"] == rev and got["history"] == [1, 2]
        r = couch.request("PUT", path, json={"n": 2, "_rev": rev})
        assert r.status_code == 201
        rev2 = r.json()["rev"]
        assert couch.request("GET", path).json()["n"] == 2
        r = couch.request("DELETE", path, params={"rev": rev2})
        assert r.status_code == 200 and r.json()["ok"] is True
        r = couch.request("GET", path)
        assert r.status_code == 404
        assert couch_error(r)[0] == "not_found"

    def test_missing_local_document_is_404(self, couch, uid):
        r = couch.request("GET", couch.doc_url("_local/" + uid + "none"))
        assert r.status_code == 404
        assert couch_error(r)[0] == "not_found"


# MARK: attachments

class TestAttachments:
    DATA = bytes(range(256)) * 40

    def test_standalone_put_get_delete(self, couch, uid):
        rev = couch.create(uid + "d", {"v": 1})
        r = couch.request("PUT", couch.doc_url(uid + "d", "pic.bin"), params={"rev": rev}, data=self.DATA,
                          headers={"Content-Type": "image/x-test"})
        assert r.status_code == 201
        rev2 = r.json()["rev"]
        assert r.json()["ok"] is True and rev_generation(rev2) == 2
        r = couch.request("GET", couch.doc_url(uid + "d", "pic.bin"))
        assert r.status_code == 200
        assert r.content == self.DATA
        assert r.headers["Content-Type"].startswith("image/x-test")
        assert r.headers.get("Content-MD5") in (None, md5_digest(self.DATA)[4:])
        stub = couch.doc(uid + "d")["_attachments"]["pic.bin"]
        assert stub == {"content_type": "image/x-test", "revpos": 2, "digest": md5_digest(self.DATA),
                        "length": len(self.DATA), "stub": True}
        r = couch.request("DELETE", couch.doc_url(uid + "d", "pic.bin"), params={"rev": rev2})
        assert r.status_code == 200
        assert "_attachments" not in couch.doc(uid + "d")
        assert couch.request("GET", couch.doc_url(uid + "d", "pic.bin")).status_code == 404

    def test_attachment_put_creates_the_document(self, couch, uid):
        r = couch.request("PUT", couch.doc_url(uid + "new", "a.txt"), data=b"hello",
                          headers={"Content-Type": "text/plain"})
        assert r.status_code == 201
        doc = couch.doc(uid + "new")
        assert doc["_attachments"]["a.txt"]["length"] == 5

    def test_attachment_put_with_a_stale_rev_is_409(self, couch, uid):
        rev = couch.create(uid + "s", {})
        couch.update(uid + "s", rev, {"v": 2})
        r = couch.request("PUT", couch.doc_url(uid + "s", "a.txt"), params={"rev": rev}, data=b"x",
                          headers={"Content-Type": "text/plain"})
        assert r.status_code == 409
        assert couch_error(r)[0] == "conflict"

    def test_missing_attachment_is_404(self, couch, uid):
        couch.create(uid + "m", {})
        r = couch.request("GET", couch.doc_url(uid + "m", "nope"))
        assert r.status_code == 404
        assert couch_error(r)[0] == "not_found"

    def test_inline_base64_attachments_become_stubs_with_md5_digest(self, couch, uid):
        rev = couch.create(uid + "i", {"_attachments": {
            "a.png": {"content_type": "image/png", "data": b64(b"alpha")},
            "b.bin": {"content_type": "application/octet-stream", "data": b64(self.DATA)}}})
        doc = couch.doc(uid + "i")
        assert doc["_rev"] == rev
        a = doc["_attachments"]["a.png"]
        assert a == {"content_type": "image/png", "revpos": 1, "digest": md5_digest(b"alpha"), "length": 5, "stub": True}
        full = couch.doc(uid + "i", attachments=True)
        assert base64.b64decode(full["_attachments"]["b.bin"]["data"]) == self.DATA
        assert full["_attachments"]["b.bin"]["digest"] == md5_digest(self.DATA)
        r = couch.request("GET", couch.doc_url(uid + "i", "a.png"))
        assert r.content == b"alpha"

    def test_text_attachments_read_back_unchanged(self, couch, uid):
        # CouchDB stores text/* gzip-compressed and then digests the compressed bytes
        # (the stub says "encoding": "gzip"); a server that stores them as sent digests
        # the bytes. Either way the bytes read back are the ones written.
        text = ("line of text\n" * 200).encode()
        couch.create(uid + "t", {"_attachments": {"t.txt": {"content_type": "text/plain", "data": b64(text)}}})
        stub = couch.doc(uid + "t", att_encoding_info=True)["_attachments"]["t.txt"]
        assert stub["length"] == len(text) and stub["digest"].startswith("md5-")
        if "encoding" not in stub:
            assert stub["digest"] == md5_digest(text)
        assert couch.request("GET", couch.doc_url(uid + "t", "t.txt")).content == text
        full = couch.doc(uid + "t", attachments=True)
        assert base64.b64decode(full["_attachments"]["t.txt"]["data"]) == text

    def test_stubs_keep_attachments_across_updates(self, couch, uid):
        rev = couch.create(uid + "k", {"_attachments": {"a.txt": {"content_type": "text/plain", "data": b64(b"keep")}}})
        doc = couch.doc(uid + "k")
        doc["v"] = 2
        r = couch.put(quote_id(uid + "k"), doc)
        assert r.status_code == 201
        doc = couch.doc(uid + "k")
        assert doc["_attachments"]["a.txt"]["revpos"] == 1 and doc["_attachments"]["a.txt"]["stub"] is True
        assert couch.request("GET", couch.doc_url(uid + "k", "a.txt")).content == b"keep"
        assert rev != doc["_rev"]

    def test_a_stub_of_an_unknown_attachment_is_refused(self, couch, uid):
        rev = couch.create(uid + "u", {})
        r = couch.put(quote_id(uid + "u"), {"_rev": rev, "_attachments": {
            "ghost": {"stub": True, "content_type": "text/plain", "digest": md5_digest(b"ghost"), "length": 5}}})
        assert r.status_code in (400, 412)
        assert couch_error(r)[0] in ("missing_stub", "bad_request", "precondition_failed")
        assert couch.doc(uid + "u")["_rev"] == rev

    def test_invalid_base64_is_400(self, couch, uid):
        r = couch.put(quote_id(uid + "b64"), {"_attachments": {"a": {"content_type": "text/plain", "data": "!!!not base64"}}})
        assert r.status_code == 400
        assert couch_error(r)[0] == "bad_request"
        assert couch.get(quote_id(uid + "b64")).status_code == 404

    def test_atts_since_inlines_only_newer_attachments(self, couch, uid):
        rev1 = couch.create(uid + "s", {"_attachments": {"old.txt": {"content_type": "image/x-old", "data": b64(b"old")}}})
        doc = couch.doc(uid + "s")
        doc["_attachments"]["new.txt"] = {"content_type": "image/x-new", "data": b64(b"new")}
        couch.put(quote_id(uid + "s"), doc)
        got = couch.doc(uid + "s", attachments=True, atts_since=[rev1])
        assert got["_attachments"]["old.txt"].get("stub") is True and "data" not in got["_attachments"]["old.txt"]
        assert base64.b64decode(got["_attachments"]["new.txt"]["data"]) == b"new"
        assert got["_attachments"]["new.txt"]["revpos"] == 2

    def test_new_edits_false_with_inline_attachment_keeps_digest_and_revpos(self, couch, uid):
        data = b"replicated attachment"
        rev = fake_rev(2, uid + "r")
        couch.store_history(uid + "r", [rev, fake_rev(1, uid + "r1")], {"v": 1}, attachments={
            "r.txt": {"content_type": "application/x-raw", "revpos": 1, "digest": md5_digest(data), "data": b64(data)}})
        stub = couch.doc(uid + "r")["_attachments"]["r.txt"]
        assert stub["digest"] == md5_digest(data) and stub["revpos"] == 1 and stub["length"] == len(data)
        assert couch.request("GET", couch.doc_url(uid + "r", "r.txt")).content == data

    def test_multipart_related_get_of_a_document(self, couch, uid):
        couch.create(uid + "mp", {"v": 1, "_attachments": {
            "a.txt": {"content_type": "text/plain", "data": b64(b"first " * 50)},
            "b.bin": {"content_type": "application/octet-stream", "data": b64(self.DATA)}}})
        r = couch.get(quote_id(uid + "mp"), params={"attachments": "true"}, headers={"Accept": "multipart/related"})
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("multipart/related")
        doc, data = parse_related_document(r.headers["Content-Type"], r.content)
        assert doc["v"] == 1
        assert doc["_attachments"]["a.txt"]["follows"] is True
        assert data == {"a.txt": b"first " * 50, "b.bin": self.DATA}

    def test_open_revs_as_multipart_mixed_like_the_replicator(self, couch, uid):
        rev = couch.create(uid + "mm", {"v": 1, "_attachments": {"a.bin": {"content_type": "application/octet-stream",
                                                                          "data": b64(self.DATA)}}})
        plain = couch.create(uid + "plain", {"v": 2})
        for accept in ("multipart/mixed",):
            r = couch.get(quote_id(uid + "mm"), params={"open_revs": jq([rev]), "revs": "true", "latest": "true",
                                                        "attachments": "true"}, headers={"Accept": accept})
            assert r.status_code == 200
            assert r.headers["Content-Type"].startswith("multipart/mixed")
            parts = parse_multipart(r.headers["Content-Type"], r.content)
            assert len(parts) == 1
            headers, content = parts[0]
            assert headers["content-type"].startswith("multipart/related")
            doc, data = parse_related_document(headers["content-type"], content)
            assert doc["_rev"] == rev and doc["_revisions"]["start"] == 1
            assert data == {"a.bin": self.DATA}
        r = couch.get(quote_id(uid + "plain"), params={"open_revs": jq([plain]), "revs": "true"},
                      headers={"Accept": "multipart/mixed"})
        parts = parse_multipart(r.headers["Content-Type"], r.content)
        assert parts[0][0]["content-type"].startswith("application/json")
        assert json.loads(parts[0][1])["_rev"] == plain

    def test_open_revs_multipart_sends_attachment_bodies_without_the_attachments_option(self, couch, uid):
        # CouchDB's replicator fetches documents with attachments this way (no
        # `attachments=true`): the attachment bodies follow the JSON all the same.
        rev = couch.create(uid + "rp", {"_attachments": {"r.bin": {"content_type": "application/octet-stream",
                                                                  "data": b64(self.DATA)}}})
        r = couch.get(quote_id(uid + "rp"), params={"revs": "true", "open_revs": jq([rev]), "latest": "true"},
                      headers={"Accept": "multipart/mixed"})
        assert r.status_code == 200
        parts = parse_multipart(r.headers["Content-Type"], r.content)
        headers, content = parts[0]
        assert headers["content-type"].startswith("multipart/related"), headers
        doc, data = parse_related_document(headers["content-type"], content)
        assert doc["_attachments"]["r.bin"]["follows"] is True
        assert data == {"r.bin": self.DATA}
        # And `_bulk_get?attachments=false`, which it tries first, answers stubs.
        r = couch.post("_bulk_get", {"docs": [{"id": uid + "rp", "rev": rev}]},
                       params={"latest": "true", "revs": "true", "attachments": "false"})
        assert r.json()["results"][0]["docs"][0]["ok"]["_attachments"]["r.bin"]["stub"] is True

    def test_open_revs_multipart_sends_bodies_of_attachments_replicated_with_revpos_0(self, couch, uid):
        # CouchDB keeps revpos 0 for content replicated without one, and sends it to its
        # replicator like any other content.
        rev, parent = fake_rev(2, uid + "r0"), fake_rev(1, uid + "r0p")
        r = couch.post("_bulk_docs", {"new_edits": False, "docs": [{
            "_id": uid + "r0", "_rev": rev, "_revisions": {"start": 2, "ids": [rev_hash(rev), rev_hash(parent)]},
            "_attachments": {"c.bin": {"content_type": "application/octet-stream", "revpos": 0,
                                       "data": b64(self.DATA)}}}]})
        assert r.status_code == 201, r.text
        r = couch.get(quote_id(uid + "r0"), params={"revs": "true", "open_revs": jq([rev]), "latest": "true"},
                      headers={"Accept": "multipart/mixed"})
        assert r.status_code == 200
        headers, content = parse_multipart(r.headers["Content-Type"], r.content)[0]
        assert headers["content-type"].startswith("multipart/related"), headers
        doc, data = parse_related_document(headers["content-type"], content)
        assert doc["_attachments"]["c.bin"]["follows"] is True
        assert data == {"c.bin": self.DATA}

    def test_multipart_attachment_parts_match_the_digest_they_are_sent_with(self, couch, uid):
        # CouchDB's replicator sends compressible content gzip-encoded with the MD5 of the
        # encoded bytes, and a CouchDB target checks each part it receives against its
        # digest: whatever form a server sends a part in, the digest must match it.
        text = b"compressible text " * 200
        z = zlib.compressobj(8, zlib.DEFLATED, 31, 8)
        encoded = z.compress(text) + z.flush()
        rev = fake_rev(1, uid + "gzd")
        doc = {"_id": uid + "gzd", "_rev": rev, "_revisions": {"start": 1, "ids": [rev_hash(rev)]},
               "_attachments": {"t.txt": {"content_type": "text/plain", "revpos": 1, "digest": md5_digest(encoded),
                                          "length": len(text), "follows": True, "encoding": "gzip",
                                          "encoded_length": len(encoded)}}}
        boundary = "gzd" + uid
        body = (b"--" + boundary.encode() + b"\r\nContent-Type: application/json\r\n\r\n" + json.dumps(doc).encode()
                + b"\r\n--" + boundary.encode() + b'\r\nContent-Disposition: attachment; filename="t.txt"\r\n'
                + b"Content-Type: text/plain\r\nContent-Encoding: gzip\r\n\r\n" + encoded
                + b"\r\n--" + boundary.encode() + b"--")
        r = couch.request("PUT", couch.doc_url(uid + "gzd"), params={"new_edits": "false"}, data=body,
                          headers={"Content-Type": 'multipart/related; boundary="%s"' % boundary})
        assert r.status_code == 201, r.text
        r = couch.get(quote_id(uid + "gzd"), params={"revs": "true", "open_revs": jq([rev]), "latest": "true"},
                      headers={"Accept": "multipart/mixed"})
        headers, content = parse_multipart(r.headers["Content-Type"], r.content)[0]
        parts = parse_multipart(headers["content-type"], content)
        att = json.loads(parts[0][1])["_attachments"]["t.txt"]
        part_headers, raw = parts[1]
        assert md5_digest(raw) == att["digest"]
        gzipped = att.get("encoding") == "gzip" or part_headers.get("content-encoding", "").lower() == "gzip"
        assert (gzip.decompress(raw) if gzipped else raw) == text
        assert att["length"] == len(text)

    def test_multipart_related_put_stores_document_and_attachments(self, couch, uid):
        big = bytes((i * 7) % 256 for i in range(200_000))
        ctype, body = build_related({"v": "mp"}, {"big.bin": ("application/octet-stream", big),
                                                  "note.txt": ("text/plain", b"note")})
        r = couch.request("PUT", couch.doc_url(uid + "put"), data=body, headers={"Content-Type": ctype})
        assert r.status_code == 201, r.text
        doc = couch.doc(uid + "put")
        assert doc["v"] == "mp"
        assert doc["_attachments"]["big.bin"]["length"] == len(big)
        assert doc["_attachments"]["big.bin"]["digest"] == md5_digest(big)
        assert couch.request("GET", couch.doc_url(uid + "put", "big.bin")).content == big
        assert couch.request("GET", couch.doc_url(uid + "put", "note.txt")).content == b"note"

    def test_multipart_put_with_new_edits_false_like_the_replicator(self, couch, uid):
        data = b"replicator multipart" * 100
        rev = fake_rev(1, uid + "rep")
        doc = {"_id": uid + "rep", "_rev": rev, "_revisions": {"start": 1, "ids": [rev_hash(rev)]},
               "_attachments": {"f.bin": {"content_type": "application/octet-stream", "revpos": 1,
                                          "digest": md5_digest(data), "length": len(data), "follows": True}}}
        ctype, body = build_related(doc, {})
        # build_related adds no extra parts for an empty dict; append the bytes as the replicator does.
        boundary = ctype.split('boundary="')[1].rstrip('"')
        body = body[: -len(b"--" + boundary.encode() + b"--")] + \
            b"--" + boundary.encode() + b"\r\n\r\n" + data + b"\r\n--" + boundary.encode() + b"--"
        r = couch.request("PUT", couch.doc_url(uid + "rep"), params={"new_edits": "false"}, data=body,
                          headers={"Content-Type": ctype})
        assert r.status_code == 201, r.text
        got = couch.doc(uid + "rep")
        assert got["_rev"] == rev
        assert got["_attachments"]["f.bin"]["digest"] == md5_digest(data)
        assert couch.request("GET", couch.doc_url(uid + "rep", "f.bin")).content == data

    def test_attachment_whose_length_does_not_match_is_refused(self, couch, uid):
        data = b"short"
        ctype, body = build_related({"v": 1}, {"a.bin": ("application/octet-stream", data)})
        body = body.replace(b'"length": 5', b'"length": 50')
        r = couch.request("PUT", couch.doc_url(uid + "len"), data=body, headers={"Content-Type": ctype})
        assert r.status_code >= 400
        assert couch.get(quote_id(uid + "len")).status_code == 404

    def test_a_false_digest_is_never_served(self, couch, uid):
        # CouchDB recomputes the digest of inline data; a server may instead refuse the
        # attachment. Either way the digest served matches the bytes served.
        rev = fake_rev(1, uid + "dm")
        r = couch.post("_bulk_docs", {"new_edits": False, "docs": [{
            "_id": uid + "dm", "_rev": rev, "_revisions": {"start": 1, "ids": [rev_hash(rev)]},
            "_attachments": {"a": {"content_type": "image/png", "revpos": 1, "digest": md5_digest(b"other"),
                                   "data": b64(b"actual")}}}]})
        assert r.status_code in (201, 400), r.text
        stored = couch.get(quote_id(uid + "dm"))
        if stored.status_code == 200:
            att = stored.json()["_attachments"]["a"]
            assert att["digest"] == md5_digest(b"actual") and att["length"] == len(b"actual")
            assert couch.request("GET", couch.doc_url(uid + "dm", "a")).content == b"actual"
        else:
            assert stored.status_code == 404
            assert r.status_code == 400 or r.json()[0].get("error")

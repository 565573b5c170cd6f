"""Two maintained CouchDB client libraries from PyPI, used as their documentation shows,
against the server under test: IBM's `ibmcloudant` (the official Cloudant/CouchDB SDK: it
gzips request bodies, reads `pending` to end a one-off changes follow, and long-polls to
listen) and `pycouchdb` (a small requests-based client: continuous changes over POST,
attachments, bulk saves). Each drives documents, bulk operations, changes feeds,
attachments, conflicts and local documents, and the results are checked."""

import base64
import io
import threading
import time
import urllib.parse

import pycouchdb
import pycouchdb.exceptions
import pytest
from ibm_cloud_sdk_core import ApiException
from ibm_cloud_sdk_core.authenticators import BasicAuthenticator
from ibmcloudant.cloudant_v1 import BulkDocs, BulkGetQueryDocument, CloudantV1, Document, Revisions
from ibmcloudant.features.changes_follower import ChangesFollower

from couchhttp import fake_rev, md5_digest, rev_hash

PAYLOAD = bytes((i * 13) % 256 for i in range(50_000))


# MARK: ibmcloudant

@pytest.fixture(scope="module")
def cloudant(server):
    service = CloudantV1(authenticator=BasicAuthenticator(server.user, server.password))
    service.set_service_url(server.base.rstrip("/"))
    return service


class TestIbmCloudant:
    def test_server_and_database_information(self, cloudant, server):
        info = cloudant.get_server_information().get_result()
        assert info["couchdb"] == "Welcome" and info["version"]
        db = cloudant.get_database_information(db=server.db).get_result()
        assert db["db_name"] == server.db and isinstance(db["doc_count"], int)
        assert cloudant.get_up_information().get_result()["status"] == "ok"
        assert server.db in cloudant.get_all_dbs().get_result()

    def test_document_create_read_update_delete(self, cloudant, server, uid):
        doc_id = uid + "crud"
        created = cloudant.put_document(db=server.db, doc_id=doc_id,
                                        document=Document(name="first", count=1)).get_result()
        assert created["ok"] and created["id"] == doc_id
        doc = cloudant.get_document(db=server.db, doc_id=doc_id).get_result()
        assert doc["name"] == "first" and doc["_rev"] == created["rev"]
        doc["count"] = 2
        updated = cloudant.put_document(db=server.db, doc_id=doc_id, document=doc).get_result()
        assert updated["rev"].startswith("2-")
        assert cloudant.head_document(db=server.db, doc_id=doc_id).get_status_code() == 200
        with pytest.raises(ApiException) as stale:
            cloudant.put_document(db=server.db, doc_id=doc_id, document=dict(doc, count=3)).get_result()
        assert stale.value.status_code == 409
        posted = cloudant.post_document(db=server.db, document=Document(made_by="post")).get_result()
        assert cloudant.get_document(db=server.db, doc_id=posted["id"]).get_result()["made_by"] == "post"
        deleted = cloudant.delete_document(db=server.db, doc_id=doc_id, rev=updated["rev"]).get_result()
        assert deleted["ok"] and deleted["rev"].startswith("3-")
        with pytest.raises(ApiException) as gone:
            cloudant.get_document(db=server.db, doc_id=doc_id).get_result()
        assert gone.value.status_code == 404

    def test_bulk_docs_all_docs_and_bulk_get(self, cloudant, server, uid):
        docs = [Document(_id=f"{uid}{i}", value=i) for i in range(10)]
        results = cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=docs)).get_result()
        assert [r["id"] for r in results] == [f"{uid}{i}" for i in range(10)]
        assert all(r["ok"] for r in results)
        page = cloudant.post_all_docs(db=server.db, include_docs=True, start_key=uid, end_key=uid + "\ufff0",
                                      limit=4, skip=2).get_result()
        assert [row["doc"]["value"] for row in page["rows"]] == [2, 3, 4, 5]
        keyed = cloudant.post_all_docs(db=server.db, keys=[f"{uid}7", f"{uid}3"]).get_result()
        assert [row["id"] for row in keyed["rows"]] == [f"{uid}7", f"{uid}3"]
        got = cloudant.post_bulk_get(db=server.db, docs=[BulkGetQueryDocument(id=f"{uid}5"),
                                                        BulkGetQueryDocument(id=uid + "absent")]).get_result()
        assert got["results"][0]["docs"][0]["ok"]["value"] == 5
        assert got["results"][1]["docs"][0]["error"]["error"] == "not_found"
        # Deleting in bulk.
        deletions = [Document(_id=r["id"], _rev=r["rev"], _deleted=True) for r in results[:3]]
        out = cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=deletions)).get_result()
        assert all(r["ok"] for r in out)
        rest = cloudant.post_all_docs(db=server.db, start_key=uid, end_key=uid + "\ufff0").get_result()
        assert len(rest["rows"]) == 7

    def test_changes_one_off_follower_and_post_changes(self, cloudant, server, uid):
        since = str(cloudant.get_database_information(db=server.db).get_result()["update_seq"])
        cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=[Document(_id=f"{uid}c{i}") for i in range(5)]))
        changes = cloudant.post_changes(db=server.db, since=since, include_docs=True).get_result()
        mine = [row for row in changes["results"] if row["id"].startswith(uid)]
        assert [row["id"] for row in mine] == [f"{uid}c{i}" for i in range(5)]
        assert mine[0]["doc"]["_id"] == f"{uid}c0"
        # The follower ends when `pending` reaches 0.
        follower = ChangesFollower(service=cloudant, db=server.db, since=since)
        seen = [item.id for item in follower.start_one_off()]
        assert [i for i in seen if i.startswith(uid)] == [f"{uid}c{i}" for i in range(5)]

    def test_changes_follower_listens_with_longpoll(self, cloudant, server, uid):
        since = str(cloudant.post_changes(db=server.db, since="now").get_result()["last_seq"])

        def write_later():
            time.sleep(0.5)
            for i in range(2):
                cloudant.put_document(db=server.db, doc_id=f"{uid}live{i}", document=Document(i=i))

        writer = threading.Thread(target=write_later)
        writer.start()
        follower = ChangesFollower(service=cloudant, db=server.db, since=since, limit=2)
        changes = follower.start()
        seen = [next(changes).id, next(changes).id]
        writer.join()
        assert seen == [f"{uid}live0", f"{uid}live1"]
        # Ending the follower waits for its long poll in flight: one more change ends it.
        cloudant.put_document(db=server.db, doc_id=f"{uid}wake", document=Document())
        assert list(changes) == []

    def test_selector_filtered_changes(self, cloudant, server, uid):
        since = str(cloudant.post_changes(db=server.db, since="now").get_result()["last_seq"])
        cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=[
            Document(_id=f"{uid}s1", kind="keep"), Document(_id=f"{uid}s2", kind="drop")]))
        changes = cloudant.post_changes(db=server.db, since=since, filter="_selector",
                                        selector={"kind": "keep"}).get_result()
        assert [row["id"] for row in changes["results"]] == [f"{uid}s1"]
        by_id = cloudant.post_changes(db=server.db, since=since, filter="_doc_ids",
                                      doc_ids=[f"{uid}s2"]).get_result()
        assert [row["id"] for row in by_id["results"]] == [f"{uid}s2"]

    def test_attachments_put_get_inline_and_delete(self, cloudant, server, uid):
        doc_id = uid + "att"
        rev = cloudant.put_document(db=server.db, doc_id=doc_id, document=Document(kind="att")).get_result()["rev"]
        put = cloudant.put_attachment(db=server.db, doc_id=doc_id, attachment_name="data.bin",
                                      attachment=io.BytesIO(PAYLOAD), content_type="application/octet-stream",
                                      rev=rev).get_result()
        assert put["ok"]
        got = cloudant.get_attachment(db=server.db, doc_id=doc_id, attachment_name="data.bin").get_result()
        assert got.content == PAYLOAD
        doc = cloudant.get_document(db=server.db, doc_id=doc_id, attachments=True).get_result()
        assert base64.b64decode(doc["_attachments"]["data.bin"]["data"]) == PAYLOAD
        stub = cloudant.get_document(db=server.db, doc_id=doc_id, att_encoding_info=True).get_result()["_attachments"]["data.bin"]
        assert stub["stub"] is True
        # The SDK gzips request bodies: CouchDB keeps such an attachment gzip-encoded and
        # then describes the encoded bytes (the stub says "encoding": "gzip"); a server
        # that decodes the upload describes the bytes themselves.
        if "encoding" not in stub:
            assert stub["digest"] == md5_digest(PAYLOAD) and stub["length"] == len(PAYLOAD)
        deleted = cloudant.delete_attachment(db=server.db, doc_id=doc_id, attachment_name="data.bin",
                                             rev=put["rev"]).get_result()
        assert deleted["ok"]
        assert "_attachments" not in cloudant.get_document(db=server.db, doc_id=doc_id).get_result()

    def test_conflicts_from_new_edits_false_and_revs_diff(self, cloudant, server, uid):
        doc_id = uid + "conflict"
        base = fake_rev(1, doc_id)
        left, right = sorted([fake_rev(2, doc_id + "L"), fake_rev(2, doc_id + "R")], key=rev_hash)
        branches = [
            Document(_id=doc_id, _rev=left, side="left", _revisions=Revisions(start=2, ids=[rev_hash(left), rev_hash(base)])),
            Document(_id=doc_id, _rev=right, side="right", _revisions=Revisions(start=2, ids=[rev_hash(right), rev_hash(base)])),
        ]
        result = cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=branches, new_edits=False)).get_result()
        assert not any("error" in r for r in result)
        doc = cloudant.get_document(db=server.db, doc_id=doc_id, conflicts=True).get_result()
        assert doc["_rev"] == right and doc["side"] == "right"
        assert doc["_conflicts"] == [left]
        missing = fake_rev(3, doc_id + "new")
        diff = cloudant.post_revs_diff(db=server.db, document_revisions={doc_id: [left, right, missing]}).get_result()
        assert diff[doc_id]["missing"] == [missing]
        # Resolve: delete the losing branch; the conflict is gone.
        cloudant.delete_document(db=server.db, doc_id=doc_id, rev=left).get_result()
        doc = cloudant.get_document(db=server.db, doc_id=doc_id, conflicts=True).get_result()
        assert "_conflicts" not in doc

    def test_local_documents(self, cloudant, server, uid):
        local_id = uid + "checkpoint"
        saved = cloudant.put_local_document(db=server.db, doc_id=local_id,
                                            document=Document(seq="42", history=[1, 2])).get_result()
        assert saved["ok"]
        got = cloudant.get_local_document(db=server.db, doc_id=local_id).get_result()
        assert got["_id"] == "_local/" + local_id and got["seq"] == "42"
        got["seq"] = "43"
        cloudant.put_local_document(db=server.db, doc_id=local_id, document=got).get_result()
        assert cloudant.get_local_document(db=server.db, doc_id=local_id).get_result()["seq"] == "43"
        since_all = cloudant.post_changes(db=server.db, since="0").get_result()
        assert not any(row["id"].startswith("_local/") for row in since_all["results"])
        cloudant.delete_local_document(db=server.db, doc_id=local_id).get_result()
        with pytest.raises(ApiException) as gone:
            cloudant.get_local_document(db=server.db, doc_id=local_id).get_result()
        assert gone.value.status_code == 404

    def test_wrong_credentials_are_refused(self, server):
        wrong = CloudantV1(authenticator=BasicAuthenticator(server.user, server.password + "-wrong"))
        wrong.set_service_url(server.base.rstrip("/"))
        with pytest.raises(ApiException) as refused:
            wrong.get_database_information(db=server.db).get_result()
        assert refused.value.status_code == 401


# MARK: pycouchdb

@pytest.fixture(scope="module")
def pydb(server):
    parts = urllib.parse.urlsplit(server.base)
    netloc = f"{urllib.parse.quote(server.user, safe='')}:{urllib.parse.quote(server.password, safe='')}@{parts.netloc}"
    couch = pycouchdb.Server(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), authmethod="basic")
    return couch.database(server.db)


class TestPyCouchDB:
    def test_document_create_read_update_delete(self, pydb, uid):
        doc = pydb.save({"_id": uid + "doc", "n": 1})
        assert doc["_rev"].startswith("1-")
        doc["n"] = 2
        doc = pydb.save(doc)
        assert pydb.get(uid + "doc")["n"] == 2
        assert (uid + "doc") in pydb
        with pytest.raises(pycouchdb.exceptions.Conflict):
            pydb.save({"_id": uid + "doc", "n": 3})
        pydb.delete(uid + "doc")
        with pytest.raises(pycouchdb.exceptions.NotFound):
            pydb.get(uid + "doc")

    def test_bulk_save_all_and_delete_bulk(self, pydb, uid):
        docs = pydb.save_bulk([{"_id": f"{uid}{i}", "i": i} for i in range(6)])
        assert all(d["_rev"].startswith("1-") for d in docs)
        rows = list(pydb.all(startkey=uid, endkey=uid + "\ufff0"))
        assert [r["doc"]["i"] for r in rows] == list(range(6))
        keyed = list(pydb.all(keys=[f"{uid}4", f"{uid}1"]))
        assert [r["id"] for r in keyed] == [f"{uid}4", f"{uid}1"]
        pydb.delete_bulk(docs[:2])
        rows = list(pydb.all(startkey=uid, endkey=uid + "\ufff0", include_docs="false"))
        assert [r["id"] for r in rows] == [f"{uid}{i}" for i in range(2, 6)]

    def test_changes_list_and_continuous_feed(self, pydb, uid):
        last_seq, _ = pydb.changes_list(since="now")
        pydb.save_bulk([{"_id": f"{uid}f{i}"} for i in range(3)])
        _, results = pydb.changes_list(since=last_seq)
        assert [r["id"] for r in results] == [f"{uid}f{i}" for i in range(3)]

        seen = []

        def reader(message, db):
            if "id" in message:
                seen.append(message["id"])
                if len(seen) == 4:
                    raise pycouchdb.exceptions.FeedReaderExited()

        def write_later():
            time.sleep(0.5)
            pydb.save({"_id": uid + "f3"})

        writer = threading.Thread(target=write_later)
        writer.start()
        pydb.changes_feed(reader, since=last_seq, heartbeat=1000)
        writer.join()
        assert seen == [f"{uid}f{i}" for i in range(4)]

    def test_attachments_put_get_and_delete(self, pydb, uid):
        doc = pydb.save({"_id": uid + "att"})
        doc = pydb.put_attachment(doc, PAYLOAD, filename="payload.bin", content_type="application/octet-stream")
        stub = doc["_attachments"]["payload.bin"]
        assert stub["length"] == len(PAYLOAD) and stub["digest"] == md5_digest(PAYLOAD)
        assert pydb.get_attachment(doc, "payload.bin") == PAYLOAD
        inline = pydb.get(uid + "att", attachments="true")
        assert base64.b64decode(inline["_attachments"]["payload.bin"]["data"]) == PAYLOAD
        doc = pydb.delete_attachment(doc, "payload.bin")
        assert "_attachments" not in pydb.get(uid + "att")

    def test_conflicts_are_visible_and_revisions_listed(self, pydb, uid):
        doc_id = uid + "c"
        base = fake_rev(1, doc_id)
        a, b = fake_rev(2, doc_id + "a"), fake_rev(2, doc_id + "b")
        for rev, side in ((a, "a"), (b, "b")):
            resp, result = pydb.resource.post("_bulk_docs", json={"new_edits": False, "docs": [
                {"_id": doc_id, "_rev": rev, "side": side, "_revisions": {"start": 2, "ids": [rev_hash(rev), rev_hash(base)]}}]})
            assert resp.status_code == 201
        doc = pydb.get(doc_id, conflicts="true")
        winner, loser = (b, a) if rev_hash(b) > rev_hash(a) else (a, b)
        assert doc["_rev"] == winner and doc["_conflicts"] == [loser]
        revs = list(pydb.revisions(doc_id))
        assert [d["_rev"] for d in revs] == [winner]

    def test_local_documents(self, pydb, uid):
        resp, result = pydb.resource.put("_local/" + uid + "cp", json={"seq": 7})
        assert resp.status_code == 201 and result["ok"]
        assert pydb.get("_local/" + uid + "cp")["seq"] == 7
        assert not any(r["id"].startswith("_local/") for r in pydb.changes_list(since=0)[1])
        resp, _ = pydb.resource.delete("_local/" + uid + "cp")
        assert resp.status_code == 200
        with pytest.raises(pycouchdb.exceptions.NotFound):
            pydb.get("_local/" + uid + "cp")

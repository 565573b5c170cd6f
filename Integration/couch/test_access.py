"""Access by content through a real node's CouchDB API, as a user whose group role admits one ward.

Run by Integration/Scenarios/AccessCouchClientScenarios.swift against a `ferry serve` that
founded a group whose rules give the role `ward-a` the documents matching {"ward": "a"}
(read and write, no delete), and whose user $FERRY_USER (password $FERRY_USER_PASSWORD) has
that role. The admin key is in $FERRY_ADMIN_KEY. Two maintained CouchDB client libraries
from PyPI (ibmcloudant and pycouchdb), and plain HTTP where they have no call, read every
route as the user and see ward a only; every forbidden write is 403.
"""

import base64
import json
import os
import urllib.parse

import pycouchdb
import pycouchdb.exceptions
import pytest
import requests
from ibm_cloud_sdk_core import ApiException
from ibm_cloud_sdk_core.authenticators import BasicAuthenticator
from ibmcloudant.cloudant_v1 import BulkGetQueryDocument, CloudantV1, Document

BASE = os.environ["FERRY_COUCH_URL"].rstrip("/")
DB = os.environ["FERRY_COUCH_DB"]
ADMIN = ("admin", os.environ["FERRY_ADMIN_KEY"])
USER = (os.environ["FERRY_USER"], os.environ["FERRY_USER_PASSWORD"])
HIDDEN = ["b-1", "b-2", "b-att"]
SHOWN = ["a-1", "a-2", "a-att"]


def url(path):
    return f"{BASE}/{DB}/{path}"


def doc_url(doc_id, query=""):
    return url(urllib.parse.quote(doc_id, safe="") + query)


def admin_put(doc_id, body):
    r = requests.put(doc_url(doc_id), json=body, auth=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["rev"]


@pytest.fixture(scope="module", autouse=True)
def patients():
    """Two patients per ward and one with an attachment each, written by the admin."""
    revs = {}
    for doc_id, ward in [("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")]:
        revs[doc_id] = admin_put(doc_id, {"ward": ward, "name": f"patient {doc_id}", "secret": f"S-{doc_id}"})
    for doc_id, ward in [("a-att", "a"), ("b-att", "b")]:
        text = base64.b64encode(f"scan of {doc_id}".encode()).decode()
        revs[doc_id] = admin_put(doc_id, {"ward": ward, "_attachments": {"scan.txt": {"content_type": "text/plain", "data": text}}})
    return revs


@pytest.fixture(scope="module")
def cloudant():
    service = CloudantV1(authenticator=BasicAuthenticator(*USER))
    service.set_service_url(BASE)
    return service


@pytest.fixture(scope="module")
def pydb():
    server = pycouchdb.Server(BASE.replace("://", f"://{USER[0]}:{USER[1]}@") + "/", authmethod="basic")
    return server.database(DB)


def assert_hides_ward_b(text):
    for doc_id in HIDDEN:
        assert f'"{doc_id}"' not in text, text
        assert f"S-{doc_id}" not in text, text


class TestIbmCloudant:
    def test_documents_and_open_revs(self, cloudant, patients):
        assert cloudant.get_document(db=DB, doc_id="a-1").get_result()["ward"] == "a"
        for doc_id in HIDDEN:
            with pytest.raises(ApiException) as e:
                cloudant.get_document(db=DB, doc_id=doc_id)
            assert e.value.status_code == 404
        r = requests.get(doc_url("b-1", "?open_revs=all"), auth=USER, timeout=30, headers={"Accept": "application/json"})
        assert r.status_code == 404 and "S-b-1" not in r.text, r.text
        r = requests.get(doc_url("b-1", f"?rev={patients['b-1']}"), auth=USER, timeout=30)
        assert r.status_code == 404, r.text

    def test_all_docs_and_keys(self, cloudant):
        rows = cloudant.post_all_docs(db=DB, include_docs=True).get_result()["rows"]
        ids = {row["id"] for row in rows}
        assert set(SHOWN) <= ids and not ids & set(HIDDEN), ids
        result = cloudant.post_all_docs(db=DB, keys=["a-1", "b-1"]).get_result()
        assert_hides_ward_b(json.dumps([row for row in result["rows"] if row.get("key") != "b-1" or "error" not in row]))
        assert all("value" not in row for row in result["rows"] if row.get("key") == "b-1"), result

    def test_changes_every_style(self, cloudant):
        result = cloudant.post_changes(db=DB, include_docs=True, style="all_docs").get_result()
        ids = {c["id"] for c in result["results"]}
        assert set(SHOWN) <= ids, ids
        assert_hides_ward_b(json.dumps(result))
        selected = cloudant.post_changes(db=DB, filter="_selector", selector={"ward": "b"}).get_result()
        assert selected["results"] == [], selected
        for feed in ["normal", "longpoll"]:
            r = requests.get(url(f"_changes?feed={feed}&include_docs=true&timeout=100"), auth=USER, timeout=30)
            assert r.status_code == 200, r.text
            assert_hides_ward_b(r.text)

    def test_bulk_get(self, cloudant, patients):
        docs = [BulkGetQueryDocument(id=i) for i in ["a-1", "b-1"]] + [BulkGetQueryDocument(id="b-2", rev=patients["b-2"])]
        result = cloudant.post_bulk_get(db=DB, docs=docs).get_result()
        text = json.dumps(result)
        assert "S-a-1" in text and "S-b-1" not in text and "S-b-2" not in text, text

    def test_find_and_explain(self, cloudant):
        found = cloudant.post_find(db=DB, selector={"name": {"$gt": None}}).get_result()["docs"]
        assert {d["_id"] for d in found} == {"a-1", "a-2"}, found
        found = cloudant.post_find(db=DB, selector={"ward": "b"}).get_result()["docs"]
        assert found == [], found
        explained = requests.post(url("_explain"), json={"selector": {"ward": "b"}}, auth=USER, timeout=30)
        assert explained.status_code == 200, explained.text
        assert_hides_ward_b(explained.text)

    def test_attachments(self, cloudant):
        body = cloudant.get_attachment(db=DB, doc_id="a-att", attachment_name="scan.txt").get_result()
        assert body.content == b"scan of a-att"
        with pytest.raises(ApiException) as e:
            cloudant.get_attachment(db=DB, doc_id="b-att", attachment_name="scan.txt")
        assert e.value.status_code == 404

    def test_revs_diff_tells_nothing_of_a_hidden_document(self, cloudant, patients):
        result = cloudant.post_revs_diff(db=DB, document_revisions={"b-1": [patients["b-1"]], "a-1": [patients["a-1"]]}).get_result()
        # Whatever it says of b-1, it says what it would say of a document it does not hold.
        assert "a-1" not in result, result
        assert "possible_ancestors" not in json.dumps(result.get("b-1", {})), result

    def test_local_documents_of_others_are_not_shared(self, cloudant):
        requests.put(url("_local/admin-only"), json={"note": "S-b-1"}, auth=ADMIN, timeout=30)
        r = requests.get(url("_local/admin-only"), auth=USER, timeout=30)
        assert r.status_code == 404 and "S-b-1" not in r.text, r.text
        # Its own checkpoint, as a replicator keeps it, is its to read.
        r = requests.put(url("_local/nurse-checkpoint"), json={"seq": "1"}, auth=USER, timeout=30)
        assert r.status_code == 201, r.text
        assert requests.get(url("_local/nurse-checkpoint"), auth=USER, timeout=30).json()["seq"] == "1"

    def test_forbidden_writes_are_403(self, cloudant, patients):
        with pytest.raises(ApiException) as e:
            cloudant.put_document(db=DB, doc_id="b-3", document=Document(ward="b"))
        assert e.value.status_code == 403
        with pytest.raises(ApiException) as e:
            cloudant.put_document(db=DB, doc_id="a-1", document=Document(ward="b", rev=patients["a-1"]))
        assert e.value.status_code == 403, "a ward-a user may not move a patient to ward b"
        with pytest.raises(ApiException) as e:
            cloudant.delete_document(db=DB, doc_id="a-2", rev=patients["a-2"])
        assert e.value.status_code == 403, "the role may not delete"
        r = requests.post(url("_bulk_docs"), json={"docs": [{"_id": "b-4", "ward": "b"}]}, auth=USER, timeout=30)
        assert r.status_code == 201 and r.json()[0].get("error") == "forbidden", r.text
        created = cloudant.put_document(db=DB, doc_id="a-3", document=Document(ward="a")).get_result()
        assert created["ok"], created


class TestPyCouchDB:
    def test_get_all_and_changes(self, pydb):
        assert pydb.get("a-2")["ward"] == "a"
        for doc_id in HIDDEN:
            with pytest.raises(pycouchdb.exceptions.NotFound):
                pydb.get(doc_id)
        ids = {row["id"] for row in pydb.all(as_list=True)}
        assert not ids & set(HIDDEN), ids
        _, changes = pydb.changes_list()
        assert not {c["id"] for c in changes} & set(HIDDEN), changes

    def test_forbidden_save_is_refused(self, pydb):
        with pytest.raises(pycouchdb.exceptions.Error):
            pydb.save({"_id": "b-5", "ward": "b"})
        r = requests.get(doc_url("b-5"), auth=ADMIN, timeout=30)
        assert r.status_code == 404, r.text

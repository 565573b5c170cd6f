"""Mango queries (`_find`, `_index`, `_explain`) through CouchDB client libraries from PyPI:
IBM's `ibmcloudant` (its query and index calls, as its documentation shows them) and
`pycouchdb` (which has no query call of its own: its resource layer posts `_find`). Every test
writes documents marked with its own `suite` value and names its own design documents, so the
suite runs against a database that holds other data, and removes the indexes it made."""

import json

import pycouchdb
import pycouchdb.exceptions
import pytest
from ibm_cloud_sdk_core import ApiException
from ibm_cloud_sdk_core.authenticators import BasicAuthenticator
from ibmcloudant.cloudant_v1 import BulkDocs, CloudantV1, Document, IndexDefinition, IndexField, Revisions

import urllib.parse

NO_INDEX = "No matching index found"

MOVIES = [
    ("m1", {"title": "Dogville", "director": "Lars von Trier", "year": 2003, "rating": 8}),
    ("m2", {"title": "Melancholia", "director": "Lars von Trier", "year": 2011, "rating": 7.1}),
    ("m3", {"title": "Star Wars", "director": "George Lucas", "year": 1977, "rating": 8.6}),
    ("m4", {"title": "Close Encounters", "director": "Steven Spielberg", "year": 1977, "rating": 7.6}),
    ("m5", {"title": "Total Recall", "director": "Paul Verhoeven", "year": 1990, "status": "classic"}),
    ("m6", {"title": "Total Recall", "director": "Len Wiseman", "year": 2012}),
    ("m7", {"title": "Interstellar", "year": 2014, "status": "classic"}),
    ("m8", {"title": "Untitled", "year": None}),
    ("m9", {"title": "Short", "year": "1993", "status": "classic"}),
]


@pytest.fixture(scope="module")
def cloudant(server):
    service = CloudantV1(authenticator=BasicAuthenticator(server.user, server.password))
    service.set_service_url(server.base.rstrip("/"))
    return service


@pytest.fixture
def movies(cloudant, server, uid):
    """The movies, each with `suite` = this test's prefix; yields the prefix."""
    docs = [Document(_id=uid + i, suite=uid, **fields) for i, fields in MOVIES]
    results = cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=docs)).get_result()
    assert all(r.get("ok") for r in results), results
    yield uid


def ids(result, uid):
    return [d["_id"][len(uid):] for d in result["docs"]]


def error_of(exc):
    body = exc.http_response.json() if exc.http_response is not None else {}
    return body.get("error"), body.get("reason")


class TestIbmCloudantQueries:
    def test_an_index_is_created_listed_used_explained_and_deleted(self, cloudant, server, movies):
        uid = movies
        ddoc = uid + "by-year"
        created = cloudant.post_index(db=server.db, ddoc=ddoc, name="year", type="json",
                                      index=IndexDefinition(fields=[IndexField(year="asc")])).get_result()
        assert created == {"result": "created", "id": "_design/" + ddoc, "name": "year"}
        again = cloudant.post_index(db=server.db, ddoc=ddoc, name="year", type="json",
                                    index=IndexDefinition(fields=[IndexField(year="asc")])).get_result()
        assert again["result"] == "exists"

        listed = cloudant.get_indexes_information(db=server.db).get_result()
        assert listed["indexes"][0] == {"ddoc": None, "name": "_all_docs", "type": "special",
                                        "def": {"fields": [{"_id": "asc"}]}}
        mine = [i for i in listed["indexes"] if i["ddoc"] == "_design/" + ddoc]
        assert len(mine) == 1 and mine[0]["name"] == "year" and mine[0]["type"] == "json"
        assert mine[0]["def"]["fields"] == [{"year": "asc"}]
        assert listed["total_rows"] == len(listed["indexes"])

        selector = {"suite": uid, "year": {"$gte": 1977}}
        found = cloudant.post_find(db=server.db, selector=selector, sort=[{"year": "asc"}],
                                   fields=["_id", "year"], execution_stats=True).get_result()
        assert ids(found, uid) == ["m3", "m4", "m5", "m1", "m2", "m6", "m7", "m9"]
        assert all(set(d) == {"_id", "year"} for d in found["docs"])
        assert NO_INDEX not in found.get("warning", "")
        stats = found["execution_stats"]
        assert stats["results_returned"] == 8
        for key in ("total_keys_examined", "total_docs_examined", "total_quorum_docs_examined", "execution_time_ms"):
            assert key in stats, stats
        desc = cloudant.post_find(db=server.db, selector=selector, sort=[{"year": "desc"}], limit=3).get_result()
        assert ids(desc, uid) == ["m9", "m7", "m6"]

        explained = cloudant.post_explain(db=server.db, selector=selector, sort=[{"year": "asc"}]).get_result()
        assert explained["index"]["ddoc"] == "_design/" + ddoc and explained["index"]["name"] == "year"
        assert explained["index"]["def"]["fields"] == [{"year": "asc"}]
        assert explained["dbname"] == server.db and explained["selector"]

        deleted = cloudant.delete_index(db=server.db, ddoc=ddoc, type="json", index="year").get_result()
        assert deleted == {"ok": True}
        listed = cloudant.get_indexes_information(db=server.db).get_result()
        assert not [i for i in listed["indexes"] if i["ddoc"] == "_design/" + ddoc]
        with pytest.raises(ApiException) as missing:
            cloudant.delete_index(db=server.db, ddoc=ddoc, type="json", index="year").get_result()
        assert missing.value.status_code == 404

    def test_find_pages_with_bookmarks_without_gaps_or_repeats(self, cloudant, server, movies):
        uid = movies
        ddoc = uid + "paging"
        cloudant.post_index(db=server.db, ddoc=ddoc, name="title", type="json",
                            index=IndexDefinition(fields=[IndexField(title="asc")])).get_result()
        try:
            selector = {"suite": uid, "title": {"$gt": None}}
            seen, bookmark, pages = [], None, 0
            while True:
                page = cloudant.post_find(db=server.db, selector=selector, sort=[{"title": "asc"}], limit=2,
                                          bookmark=bookmark).get_result()
                pages += 1
                seen += [d["title"] for d in page["docs"]]
                bookmark = page["bookmark"]
                if len(page["docs"]) < 2:
                    break
            assert seen == ["Close Encounters", "Dogville", "Interstellar", "Melancholia", "Short", "Star Wars",
                            "Total Recall", "Total Recall", "Untitled"]
            assert pages == 5
            # Without a sort (any index or a scan) the pages still cover every document once.
            seen, bookmark = [], None
            for _ in range(20):
                page = cloudant.post_find(db=server.db, selector={"suite": uid}, limit=4, bookmark=bookmark).get_result()
                seen += [d["_id"] for d in page["docs"]]
                bookmark = page["bookmark"]
                if len(page["docs"]) < 4:
                    break
            assert sorted(seen) == sorted(uid + i for i, _ in MOVIES)
            skipped = cloudant.post_find(db=server.db, selector=selector, sort=[{"title": "asc"}], skip=7).get_result()
            assert [d["title"] for d in skipped["docs"]] == ["Total Recall", "Untitled"]
        finally:
            cloudant.delete_index(db=server.db, ddoc=ddoc, type="json", index="title").get_result()

    def test_a_partial_index_holds_only_the_documents_its_filter_admits(self, cloudant, server, movies):
        uid = movies
        ddoc = uid + "classics"
        created = cloudant.post_index(
            db=server.db, ddoc=ddoc, name="classic-years", type="json",
            index=IndexDefinition(fields=[IndexField(year="asc")],
                                  partial_filter_selector={"status": "classic"})).get_result()
        assert created["result"] == "created"
        try:
            listed = cloudant.get_indexes_information(db=server.db).get_result()
            mine = [i for i in listed["indexes"] if i["ddoc"] == "_design/" + ddoc][0]
            # Listed in its normalised form, as CouchDB lists it.
            assert mine["def"]["partial_filter_selector"] == {"status": {"$eq": "classic"}}
            # The selector asks for what the filter admits, so the index holds every answer.
            selector = {"suite": uid, "status": "classic", "year": {"$gt": 0}}
            found = cloudant.post_find(db=server.db, selector=selector, use_index=[ddoc, "classic-years"],
                                       sort=[{"year": "asc"}]).get_result()
            # m9's year is a string: it sorts after every number and is in the range.
            assert ids(found, uid) == ["m5", "m7", "m9"]
            assert NO_INDEX not in found.get("warning", "")
            explained = cloudant.post_explain(db=server.db, selector=selector,
                                              use_index=[ddoc, "classic-years"]).get_result()
            assert explained["index"]["name"] == "classic-years"
        finally:
            cloudant.delete_index(db=server.db, ddoc=ddoc, type="json", index="classic-years").get_result()

    def test_a_query_without_an_index_scans_and_says_so(self, cloudant, server, movies):
        uid = movies
        found = cloudant.post_find(db=server.db, selector={"suite": uid, "director": "Lars von Trier"},
                                   fields=["title"]).get_result()
        assert sorted(d["title"] for d in found["docs"]) == ["Dogville", "Melancholia"]
        assert NO_INDEX in found["warning"]
        missing = cloudant.post_find(db=server.db, selector={"suite": uid, "rating": {"$exists": False}}).get_result()
        assert sorted(ids(missing, uid)) == ["m5", "m6", "m7", "m8", "m9"]
        ne = cloudant.post_find(db=server.db, selector={"suite": uid, "rating": {"$ne": 8}}).get_result()
        assert sorted(ids(ne, uid)) == ["m2", "m3", "m4"]

    def test_conflicts_are_listed_when_asked_for(self, cloudant, server, uid):
        doc_id = uid + "clash"
        base = cloudant.put_document(db=server.db, doc_id=doc_id, document=Document(suite=uid, v=0)).get_result()["rev"]
        base_hash = base.split("-", 1)[1]
        left, right = "2-" + "a" * 32, "2-" + "b" * 32
        branches = [Document(_id=doc_id, _rev=rev, suite=uid, v=n,
                             _revisions=Revisions(start=2, ids=[rev.split("-", 1)[1], base_hash]))
                    for n, rev in ((1, left), (2, right))]
        cloudant.post_bulk_docs(db=server.db, bulk_docs=BulkDocs(docs=branches, new_edits=False)).get_result()
        found = cloudant.post_find(db=server.db, selector={"suite": uid}, conflicts=True).get_result()
        assert [(d["_rev"], d["v"], d["_conflicts"]) for d in found["docs"]] == [(right, 2, [left])]
        plain = cloudant.post_find(db=server.db, selector={"suite": uid}).get_result()
        assert [d["_rev"] for d in plain["docs"]] == [right] and "_conflicts" not in plain["docs"][0]
        # The selector sees the winner only.
        assert cloudant.post_find(db=server.db, selector={"suite": uid, "v": 1}).get_result()["docs"] == []

    @pytest.mark.parametrize("selector, sort, error", [
        ({"year": {"$foo": 1}}, None, "invalid_operator"),
        ({"year": {"$in": 5}}, None, "bad_arg"),
        ({"title": {"$regex": "("}}, None, "bad_arg"),
        ({"year": {"$size": "3"}}, None, "bad_arg"),
        ({"year": {"$gt": 0}}, [{"no-such-field": "asc"}], "no_usable_index"),
    ])
    def test_bad_queries_are_refused_with_couchdbs_errors(self, cloudant, server, uid, selector, sort, error):
        with pytest.raises(ApiException) as refused:
            cloudant.post_find(db=server.db, selector=dict(selector, suite=uid), sort=sort).get_result()
        assert refused.value.status_code == 400
        name, reason = error_of(refused.value)
        assert name == error and reason

    def test_a_bad_index_request_is_refused(self, cloudant, server, uid):
        with pytest.raises(ApiException) as refused:
            cloudant.post_index(db=server.db, ddoc=uid + "bad", name="bad", type="json",
                                index=IndexDefinition(fields=[IndexField(year="sideways")])).get_result()
        assert refused.value.status_code == 400
        name, reason = error_of(refused.value)
        assert name and reason


# MARK: pycouchdb

@pytest.fixture(scope="module")
def pydb(server):
    parts = urllib.parse.urlsplit(server.base)
    netloc = f"{urllib.parse.quote(server.user, safe='')}:{urllib.parse.quote(server.password, safe='')}@{parts.netloc}"
    couch = pycouchdb.Server(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), authmethod="basic")
    return couch.database(server.db)


def py_post(pydb, path, body):
    _, result = pydb.resource.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"})
    return result


class TestPyCouchDBQueries:
    def test_find_and_index_through_the_resource_layer(self, pydb, uid):
        pydb.save_bulk([dict(fields, _id=uid + i, suite=uid) for i, fields in MOVIES])
        ddoc = uid + "py"
        made = py_post(pydb, "_index", {"index": {"fields": ["director", "year"]}, "ddoc": ddoc, "name": "dy"})
        assert made["result"] == "created" and made["id"] == "_design/" + ddoc
        try:
            found = py_post(pydb, "_find", {"selector": {"suite": uid, "director": "Lars von Trier"},
                                            "sort": [{"director": "desc"}, {"year": "desc"}], "fields": ["title"]})
            assert [d["title"] for d in found["docs"]] == ["Melancholia", "Dogville"]
            assert NO_INDEX not in found.get("warning", "")
            with pytest.raises(pycouchdb.exceptions.GenericError) as refused:
                py_post(pydb, "_find", {"selector": {"suite": uid, "year": {"$nope": 1}}})
            assert "invalid_operator" in str(refused.value)
        finally:
            _, gone = pydb.resource.delete(["_index", ddoc, "json", "dy"])
            assert gone == {"ok": True}

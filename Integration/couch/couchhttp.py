"""Plain-HTTP access to one CouchDB-protocol database, and the MIME multipart helpers the
conformance suite and the reference replicator share. Written from the CouchDB 3.x API
reference; no CouchDB client library is used here, so what the tests see is the wire."""

import base64
import gzip
import hashlib
import json
import re
import urllib.parse
import uuid

import requests

TIMEOUT = 60


def quote_id(doc_id):
    """The path segment(s) for a document ID: `_design/` and `_local/` keep their slash."""
    for prefix in ("_design/", "_local/"):
        if doc_id.startswith(prefix):
            return prefix + urllib.parse.quote(doc_id[len(prefix):], safe="")
    return urllib.parse.quote(doc_id, safe="")


def jq(value):
    """A JSON-encoded query parameter value (startkey, keys, open_revs, doc_ids…)."""
    return json.dumps(value, separators=(",", ":"))


def md5_digest(data):
    """CouchDB's attachment digest: "md5-" + base64 of the MD5 of the bytes."""
    return "md5-" + base64.b64encode(hashlib.md5(data).digest()).decode()


def rev_generation(rev):
    return int(rev.split("-", 1)[0])


def rev_hash(rev):
    return rev.split("-", 1)[1]


def fake_rev(generation, seed):
    """A CouchDB-form revision ID (N- + 32 hex) derived from a seed string."""
    return f"{generation}-{hashlib.md5(seed.encode()).hexdigest()}"


class CouchServer:
    """One database on one CouchDB-protocol server, with credentials."""

    def __init__(self, base, db, user, password):
        self.base = base if base.endswith("/") else base + "/"
        self.db = db
        self.user = user
        self.password = password
        self.http = requests.Session()
        self.http.auth = (user, password)

    def __repr__(self):
        return f"CouchServer({self.base}{self.db})"

    @property
    def db_url(self):
        return self.base + urllib.parse.quote(self.db, safe="")

    def url(self, path=""):
        """A URL under the database: "" is the database itself, "_changes", "docid"…"""
        return self.db_url + ("/" + path if path else "")

    def doc_url(self, doc_id, attachment=None):
        u = self.url(quote_id(doc_id))
        if attachment is not None:
            u += "/" + urllib.parse.quote(attachment, safe="")
        return u

    def request(self, method, url, auth=True, **kw):
        kw.setdefault("timeout", TIMEOUT)
        if auth:
            return self.http.request(method, url, **kw)
        return requests.request(method, url, **kw)

    # Shorthands on the database. `path` is relative to the database URL.
    def get(self, path="", **kw):
        return self.request("GET", self.url(path), **kw)

    def post(self, path, body=None, **kw):
        if body is not None:
            kw["json"] = body
        return self.request("POST", self.url(path), **kw)

    def put(self, path, body=None, **kw):
        if body is not None:
            kw["json"] = body
        return self.request("PUT", self.url(path), **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", self.url(path), **kw)

    # Document helpers that assert success.
    def create(self, doc_id, body):
        r = self.request("PUT", self.doc_url(doc_id), json=body)
        assert r.status_code in (201, 202), f"PUT {doc_id}: {r.status_code} {r.text}"
        return r.json()["rev"]

    def update(self, doc_id, rev, body):
        return self.create(doc_id, dict(body, _rev=rev))

    def remove(self, doc_id, rev):
        r = self.request("DELETE", self.doc_url(doc_id), params={"rev": rev})
        assert r.status_code in (200, 202), f"DELETE {doc_id}: {r.status_code} {r.text}"
        return r.json()["rev"]

    def doc(self, doc_id, **params):
        r = self.request("GET", self.doc_url(doc_id), params=_encode_params(params),
                         headers={"Accept": "application/json"})
        assert r.status_code == 200, f"GET {doc_id}: {r.status_code} {r.text}"
        return r.json()

    def bulk_docs(self, docs, **extra):
        r = self.post("_bulk_docs", dict(extra, docs=docs))
        assert r.status_code in (201, 202), f"_bulk_docs: {r.status_code} {r.text}"
        return r.json()

    def store_history(self, doc_id, revs, body=None, deleted=False, attachments=None):
        """Stores one branch with new_edits=false: `revs` newest first, all of one history."""
        newest = revs[0]
        doc = dict(body or {}, _id=doc_id, _rev=newest,
                   _revisions={"start": rev_generation(newest), "ids": [rev_hash(r) for r in revs]})
        if deleted:
            doc["_deleted"] = True
        if attachments:
            doc["_attachments"] = attachments
        result = self.bulk_docs([doc], new_edits=False)
        assert not any("error" in r for r in result), result
        return newest

    def info(self):
        r = self.get()
        assert r.status_code == 200, r.text
        return r.json()

    def changes(self, **params):
        r = self.get("_changes", params=_encode_params(params))
        assert r.status_code == 200, f"_changes: {r.status_code} {r.text}"
        return r.json()

    def update_seq(self):
        return self.info()["update_seq"]


def _encode_params(params):
    """Query parameters as CouchDB wants them: booleans as true/false, lists as JSON."""
    out = {}
    for k, v in params.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (list, dict)):
            out[k] = jq(v)
        else:
            out[k] = v
    return out


encode_params = _encode_params


def couch_error(response):
    """The (error, reason) of a CouchDB-shaped error body; asserts the shape."""
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    assert isinstance(body.get("reason"), str), body
    return body["error"], body["reason"]


# MIME multipart, as CouchDB sends (multipart/mixed of open_revs, multipart/related of a
# document with attachments) and receives (multipart/related PUT).

def boundary_of(content_type):
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    assert m, f"no boundary in {content_type!r}"
    return m.group(1)


def parse_multipart(content_type, body):
    """Splits a multipart body into parts: a list of (headers dict lower-cased, bytes)."""
    boundary = boundary_of(content_type).encode()
    delimiter = b"--" + boundary
    parts = []
    chunks = body.split(delimiter)
    # chunks[0] is the preamble; the last one starts with "--" (the close delimiter).
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        if chunk.startswith(b"\r\n"):
            chunk = chunk[2:]
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            # A part without headers starts directly with its blank line.
            if chunk.startswith(b"\r\n"):
                head, content = b"", chunk[2:]
            else:
                raise AssertionError(f"malformed multipart part: {chunk[:200]!r}")
        if content.endswith(b"\r\n"):
            content = content[:-2]
        headers = {}
        for line in head.split(b"\r\n"):
            if b":" in line:
                name, _, value = line.partition(b":")
                headers[name.decode().strip().lower()] = value.decode().strip()
        parts.append((headers, content))
    return parts


def parse_related_document(content_type, body):
    """A multipart/related document: (doc JSON, {attachment name: bytes}) matched in the
    order the `follows` stubs appear in the JSON, or by Content-Disposition filename."""
    parts = parse_multipart(content_type, body)
    assert parts, "empty multipart/related"
    doc = json.loads(parts[0][1])
    following = [name for name, att in (doc.get("_attachments") or {}).items() if att.get("follows")]
    data = {}
    for index, (headers, content) in enumerate(parts[1:]):
        disposition = headers.get("content-disposition", "")
        m = re.search(r'filename="([^"]*)"', disposition)
        name = urllib.parse.unquote(m.group(1)) if m else following[index]
        if headers.get("content-encoding", "").lower() == "gzip":
            content = gzip.decompress(content)
        data[name] = content
    return doc, data


def build_related(doc, attachments):
    """A multipart/related request body for a document whose attachments follow it.
    `attachments`: {name: (content_type, bytes)}. Returns (content_type, body)."""
    boundary = "ferry-" + uuid.uuid4().hex
    doc = dict(doc)
    stubs = dict(doc.get("_attachments") or {})
    for name, (ctype, data) in attachments.items():
        stubs[name] = {"follows": True, "content_type": ctype, "length": len(data)}
    doc["_attachments"] = stubs
    out = [b"--" + boundary.encode() + b"\r\n", b"Content-Type: application/json\r\n\r\n",
           json.dumps(doc).encode(), b"\r\n"]
    for name, (ctype, data) in attachments.items():
        out += [b"--" + boundary.encode() + b"\r\n",
                f'Content-Disposition: attachment; filename="{name}"\r\n'.encode(),
                f"Content-Type: {ctype}\r\n".encode(),
                f"Content-Length: {len(data)}\r\n\r\n".encode(),
                data, b"\r\n"]
    out.append(b"--" + boundary.encode() + b"--")
    return f'multipart/related; boundary="{boundary}"', b"".join(out)


def b64(data):
    return base64.b64encode(data).decode()

"""A reference replicator, written from the CouchDB Replication Protocol (version 3):
one-shot replication of every document from a source database to a target database over
the CouchDB HTTP API, resuming from checkpoints kept in `_local` on both sides.

    verify peers → replication ID → read both checkpoints, compare histories → since
    loop: _changes (style=all_docs, feed=normal, since, limit)
          → target _revs_diff → source _bulk_get (revs, attachments, latest; else
          GET ?open_revs=…) → target _bulk_docs new_edits=false → target
          _ensure_full_commit → write the checkpoint on both sides

Run by hand:  python refrep.py SOURCE_URL SOURCE_DB TARGET_URL TARGET_DB
(URLs may carry user:password@; FERRY_COUCH_USER/FERRY_COUCH_PASSWORD are used otherwise).
"""

import datetime
import hashlib
import json
import os
import sys
import urllib.parse
import uuid

from couchhttp import CouchServer, jq

PROTOCOL_VERSION = 3
MAX_HISTORY = 50


class ReplicationError(Exception):
    """A replication that cannot go on: a peer is unreachable or refuses a step."""


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


def _check(response, what, ok=(200,)):
    if response.status_code not in ok:
        raise ReplicationError(f"{what}: HTTP {response.status_code} {response.text[:500]}")
    return response.json() if response.content else None


class Replicator:
    """Replicates `source` into `target` once, from the last common checkpoint."""

    def __init__(self, source, target, batch_size=100, use_bulk_get=True, doc_ids=None):
        self.source = source
        self.target = target
        self.batch_size = batch_size
        self.use_bulk_get = use_bulk_get
        self.doc_ids = sorted(doc_ids) if doc_ids else None
        self.session_id = uuid.uuid4().hex
        self.stats = dict(missing_checked=0, missing_found=0, docs_read=0, docs_written=0, doc_write_failures=0,
                          bulk_get_used=False, open_revs_used=False)
        self.failures = []

    # 1. Verify peers.
    def verify_peers(self):
        for role, peer in (("source", self.source), ("target", self.target)):
            welcome = _check(peer.request("GET", peer.base), f"{role} GET /")
            if "couchdb" not in welcome:
                raise ReplicationError(f"{role} is not a CouchDB-protocol server: {welcome}")
            r = peer.get()
            if r.status_code == 404:
                raise ReplicationError(f"{role} database {peer.db} does not exist")
            _check(r, f"{role} GET /{peer.db}")

    # 2. Replication ID: the same peers and options give the same ID on every run.
    @property
    def replication_id(self):
        def where(peer):
            u = urllib.parse.urlsplit(peer.base)
            netloc = u.hostname + (f":{u.port}" if u.port else "")
            return f"{u.scheme}://{netloc}{u.path}{peer.db}"

        key = json.dumps({"version": PROTOCOL_VERSION, "source": where(self.source), "target": where(self.target),
                          "doc_ids": self.doc_ids}, sort_keys=True)
        return hashlib.md5(key.encode()).hexdigest()

    @property
    def checkpoint_id(self):
        return "_local/" + self.replication_id

    def _read_log(self, peer):
        r = peer.request("GET", peer.doc_url(self.checkpoint_id), headers={"Accept": "application/json"})
        if r.status_code == 404:
            return None
        return _check(r, f"GET {self.checkpoint_id}")

    # 3. Find common ancestry: compare the replication logs of both sides.
    @staticmethod
    def compare_logs(source_log, target_log):
        if not source_log or not target_log:
            return 0
        if source_log.get("session_id") == target_log.get("session_id"):
            return source_log.get("source_last_seq", 0)
        target_sessions = {h.get("session_id") for h in target_log.get("history", [])}
        for entry in source_log.get("history", []):
            if entry.get("session_id") in target_sessions:
                return entry.get("recorded_seq", 0)
        return 0

    def run(self):
        """Replicates until the source has no more changes; returns the statistics."""
        self.verify_peers()
        source_log, target_log = self._read_log(self.source), self._read_log(self.target)
        since = self.compare_logs(source_log, target_log)
        start_seq, start_time = since, _now()
        self.stats["start_seq"] = since
        self.stats["resumed"] = since != 0
        history = (source_log or {}).get("history", [])
        revs = {"source": (source_log or {}).get("_rev"), "target": (target_log or {}).get("_rev")}
        while True:
            batch = self._changes(since)
            results = batch["results"]
            if results:
                self._replicate_batch(results)
            since = batch["last_seq"] if results else since
            # 5. Ensure in commit, then record the checkpoint on both sides.
            _check(self.target.post("_ensure_full_commit", headers={"Content-Type": "application/json"}),
                   "target _ensure_full_commit", ok=(200, 201))
            entry = dict(self.stats_for_history(), session_id=self.session_id, start_time=start_time,
                         end_time=_now(), start_last_seq=start_seq, end_last_seq=since, recorded_seq=since)
            log = {"session_id": self.session_id, "source_last_seq": since,
                   "replication_id_version": PROTOCOL_VERSION,
                   "history": ([entry] + [h for h in history if h.get("session_id") != self.session_id])[:MAX_HISTORY]}
            for role, peer in (("source", self.source), ("target", self.target)):
                body = dict(log, _rev=revs[role]) if revs[role] else dict(log)
                saved = _check(peer.request("PUT", peer.doc_url(self.checkpoint_id), json=body),
                               f"{role} PUT {self.checkpoint_id}", ok=(200, 201))
                revs[role] = saved["rev"]
            if len(results) < self.batch_size:
                break
        self.stats["last_seq"] = since
        return self.stats

    def stats_for_history(self):
        return {k: self.stats[k] for k in ("missing_checked", "missing_found", "docs_read", "docs_written",
                                            "doc_write_failures")}

    # 4. Locate changed documents.
    def _changes(self, since):
        params = {"style": "all_docs", "feed": "normal", "since": since if isinstance(since, str) else str(since),
                  "limit": self.batch_size}
        if self.doc_ids:
            params["filter"] = "_doc_ids"
            r = self.source.post("_changes", {"doc_ids": self.doc_ids}, params=params)
        else:
            r = self.source.get("_changes", params=params)
        return _check(r, "source _changes")

    def _replicate_batch(self, results):
        wanted = {}
        for row in results:
            if row["id"].startswith("_local/"):
                raise ReplicationError(f"source _changes lists a local document: {row['id']}")
            wanted.setdefault(row["id"], [])
            for change in row["changes"]:
                if change["rev"] not in wanted[row["id"]]:
                    wanted[row["id"]].append(change["rev"])
        self.stats["missing_checked"] += sum(len(v) for v in wanted.values())
        diff = _check(self.target.post("_revs_diff", wanted), "target _revs_diff")
        if not diff:
            return
        self.stats["missing_found"] += sum(len(v["missing"]) for v in diff.values())
        docs = self._fetch(diff)
        self.stats["docs_read"] += len(docs)
        if not docs:
            return
        r = self.target.post("_bulk_docs", {"docs": docs, "new_edits": False})
        result = _check(r, "target _bulk_docs", ok=(201, 202))
        errors = [x for x in result if "error" in x]
        self.failures += errors
        self.stats["doc_write_failures"] += len(errors)
        self.stats["docs_written"] += len(docs) - len(errors)

    # Fetch the missing revisions with their history and attachments.
    def _fetch(self, diff):
        requests_ = [{"id": doc_id, "rev": rev, **({"atts_since": d["possible_ancestors"]} if d.get("possible_ancestors") else {})}
                     for doc_id, d in diff.items() for rev in d["missing"]]
        if self.use_bulk_get:
            r = self.source.post("_bulk_get", {"docs": requests_},
                                 params={"revs": "true", "attachments": "true", "latest": "true"},
                                 headers={"Accept": "application/json"})
            if r.status_code in (200,):
                self.stats["bulk_get_used"] = True
                docs = []
                for result in r.json()["results"]:
                    for item in result["docs"]:
                        if "ok" in item:
                            docs.append(item["ok"])
                        else:
                            self.failures.append(item.get("error"))
                            self.stats["doc_write_failures"] += 1
                return _unique(docs)
            if r.status_code not in (400, 404, 405, 501):
                _check(r, "source _bulk_get")
        return self._fetch_open_revs(diff)

    def _fetch_open_revs(self, diff):
        self.stats["open_revs_used"] = True
        docs = []
        for doc_id, d in diff.items():
            params = {"open_revs": jq(d["missing"]), "revs": "true", "latest": "true", "attachments": "true"}
            if d.get("possible_ancestors"):
                params["atts_since"] = jq(d["possible_ancestors"])
            r = self.source.request("GET", self.source.doc_url(doc_id), params=params,
                                    headers={"Accept": "application/json"})
            for item in _check(r, f"source GET {doc_id}?open_revs"):
                if "ok" in item:
                    docs.append(item["ok"])
                else:
                    self.failures.append(item)
        return _unique(docs)


def _unique(docs):
    """One copy of each (id, rev): `latest` may resolve two requests to the same leaf."""
    seen, out = set(), []
    for doc in docs:
        key = (doc["_id"], doc["_rev"])
        if key not in seen:
            seen.add(key)
            out.append(doc)
    return out


def replicate(source, target, **options):
    return Replicator(source, target, **options).run()


def _server_from_url(url, db):
    u = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(u.username) if u.username else os.environ.get("FERRY_COUCH_USER", "admin")
    password = urllib.parse.unquote(u.password) if u.password else os.environ.get("FERRY_COUCH_PASSWORD", "admin")
    netloc = u.hostname + (f":{u.port}" if u.port else "")
    return CouchServer(urllib.parse.urlunsplit((u.scheme, netloc, u.path or "/", "", "")), db, user, password)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    stats = replicate(_server_from_url(sys.argv[1], sys.argv[2]), _server_from_url(sys.argv[3], sys.argv[4]))
    print(json.dumps(stats, indent=2))

import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation

/// What this run knows of each replication's `_local` checkpoint document on the server:
/// its `_rev` (to update it), its history, and where and when this session started.
struct CouchCheckpointState {
    struct Record {
        var rev: String?
        var history: [JSON] = []
        var startTime: Date
        var startLastSeq: JSON?
    }
    var records: [String: Record] = [:]
    /// Revisions this run fetched (pull) and sent (push), for the history's counters.
    var docsRead = 0
    var docsWritten = 0
    var docWriteFailures = 0
}

// Checkpoints as the CouchDB Replication Protocol keeps them: a `_local/{replication-id}`
// document holding `session_id`, `source_last_seq` and a history of sessions, newest first.
// The replication ID is Ferry's checkpoint key (a hex SHA-256 over both database IDs, the
// direction, the filter's name and the document IDs); Ferry keeps its own copy in this
// node's store (the Checkpointer), so only the server's copy is handled here.
extension CouchRemote {
    /// `_local/{id}`'s body without `_id` and `_rev`; nil when the server has none.
    func localDocument(_ id: String) async throws -> JSON? {
        try await readLocal(id)?.body
    }

    /// Writes `_local/{id}` with `value`, updating whatever revision the server holds.
    func putLocalDocument(_ id: String, value: JSON) async throws {
        guard var fields = value.objectValue else {
            throw CouchClientError(.badLocalDocument, message: "a local document must be a JSON object", isTransient: false)
        }
        fields["_rev"] = nil
        fields["_id"] = nil
        let rev = try await readLocal(id)?.rev
        try await writeLocal(id, fields: fields, rev: rev)
    }

    /// The server's copy, as `{"seq": source_last_seq}`; also remembered as this session's start.
    func checkpoint(_ id: String, direction: CheckpointDirection) async throws -> RemoteCheckpoint {
        let found = try await readLocal(id)
        let seq = found?.body["source_last_seq"]
        var history: [JSON] = []
        if case .array(let h)? = found?.body["history"] { history = h }
        let record = CouchCheckpointState.Record(rev: found?.rev, history: history, startTime: wallClock(), startLastSeq: seq)
        checkpointState.withLock { $0.records[id] = record }
        guard let seq, seq != .null else { return RemoteCheckpoint(value: nil) }
        return RemoteCheckpoint(value: ["seq": seq])
    }

    /// Writes `_local/{id}` with this session's `session_id`, `source_last_seq` and history
    /// (at most `historyKept` sessions, newest first).
    func putCheckpoint(_ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool) async throws {
        guard let seq = value["seq"] else {
            throw CouchClientError(.badCheckpoint, message: "a checkpoint needs a \"seq\"", isTransient: false)
        }
        let now = wallClock()
        let (record, counts) = checkpointState.withLock { s -> (CouchCheckpointState.Record, (Int, Int, Int)) in
            let r = s.records[id] ?? CouchCheckpointState.Record(rev: nil, startTime: now, startLastSeq: nil)
            s.records[id] = r
            return (r, (s.docsRead, s.docsWritten, s.docWriteFailures))
        }
        var entry: [String: JSON] = [
            "session_id": .string(sessionID), "start_time": .string(Self.httpDate(record.startTime)),
            "end_time": .string(Self.httpDate(now)), "start_last_seq": record.startLastSeq ?? 0,
            "end_last_seq": seq, "recorded_seq": seq,
        ]
        switch direction {
        case .pull: entry["docs_read"] = .int(Int64(counts.0))
        case .push:
            entry["docs_written"] = .int(Int64(counts.1))
            entry["doc_write_failures"] = .int(Int64(counts.2))
        }
        let earlier = record.history.filter { $0["session_id"]?.stringValue != sessionID }
        let history = Array(([JSON.object(entry)] + earlier).prefix(Self.historyKept))
        let fields: [String: JSON] = [
            "session_id": .string(sessionID), "source_last_seq": seq, "replication_id_version": .int(Self.replicationIDVersion),
            "replicator": "ferry", "history": .array(history),
        ]
        var rev = record.rev
        do {
            rev = try await writeLocal(id, fields: fields, rev: rev)
        } catch let e as CouchClientError where e.status == 409 {
            // Someone else wrote it (another run, or the other side's replicator): re-read once.
            rev = try await readLocal(id)?.rev
            rev = try await writeLocal(id, fields: fields, rev: rev)
        }
        checkpointState.withLock { s in
            s.records[id]?.rev = rev
            s.records[id]?.history = history
        }
    }

    /// Counts revisions the push side stored on the server (for the checkpoint history).
    func countWritten(_ written: Int, failures: Int) {
        checkpointState.withLock {
            $0.docsWritten += written
            $0.docWriteFailures += failures
        }
    }

    /// Sessions a checkpoint's history keeps, as CouchDB's replicator does.
    static let historyKept = 50
    /// The version of how Ferry derives replication IDs (its checkpoint keys).
    static let replicationIDVersion: Int64 = 1

    // MARK: Requests

    func readLocal(_ id: String) async throws -> (body: JSON, rev: String?)? {
        let path = http.databasePath("_local/" + CouchEndpoint.escapeDatabase(id))
        let response = try await http.send(.GET, path)
        if response.status == 404 { return nil }
        guard (200..<300).contains(response.status) else {
            throw CouchClientError.http(response, method: .GET, path: path, endpoint: http.endpoint)
        }
        guard var fields = response.json?.objectValue else {
            throw CouchClientError(
                .badResponse, message: "GET \(path): the answer is not a JSON object", isTransient: true, status: response.status)
        }
        let rev = fields.removeValue(forKey: "_rev")?.stringValue
        fields["_id"] = nil
        return (.object(fields), rev)
    }

    /// PUTs `_local/{id}` and returns its new `_rev`.
    @discardableResult
    func writeLocal(_ id: String, fields: [String: JSON], rev: String?) async throws -> String? {
        var doc = fields
        doc["_id"] = .string("_local/" + id)
        if let rev { doc["_rev"] = .string(rev) }
        let answer = try await http.json(.PUT, http.databasePath("_local/" + CouchEndpoint.escapeDatabase(id)), body: .object(doc))
        return answer["rev"]?.stringValue
    }

    /// RFC 1123 time, as CouchDB's replicator writes `start_time`.
    static func httpDate(_ date: Date) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return f.string(from: date)
    }
}

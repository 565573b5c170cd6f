import FerryCore
import FerryCouchDocuments
import FerryStore
import Testing

@testable import FerryCouch

/// The CouchDB API answers a store error with the status every API gives its kind of
/// failure (`FailureKind`), except CouchDB's own `412 missing_stub`.
@Suite struct DocumentErrorStatusTests {
    static let id = DocumentID(unchecked: "d")
    static let rev = try! RevisionID("1-" + String(repeating: "a", count: 32))
    static let blob = BlobDigest.of([1])
    static let every: [StoreError] = [
        .conflict(id: id, given: rev, current: rev), .notFound(id), .revisionNotFound(id, rev), .bodyNotRetained(id, rev),
        .invalidDocumentID(.empty), .invalidBody("x"), .tooLarge(bytes: 2, limit: 1), .tooManyLeaves(id, limit: 5),
        .digestMismatch(id, rev), .invalidHistory(id, "x"), .rejected(id, reason: "x"), .missingBlob(blob), .blobCorrupt(blob),
        .blobLengthMismatch(blob, declared: 1, actual: 2), .corrupt("x"), .busy("x"), .io("x"), .database("x"),
        .noDatabase(directory: "/x"), .indexUnavailable(id: 1, reason: "x"),
    ]

    @Test func everyStoreErrorIsAnsweredWithTheStatusOfItsKind() throws {
        let database = CouchDatabase(name: "ferry", store: try DocumentStore.inMemory(), serverUUID: "test-uuid")
        for error in Self.every {
            let answer = database.couchError(error)
            let expected = error == .missingBlob(Self.blob) ? 412 : error.failure.httpStatus
            #expect(answer.status.code == expected, "\(error): \(answer.status.code)")
        }
        // The two the CouchDB API answered differently from every other API.
        #expect(database.couchError(.tooManyLeaves(Self.id, limit: 5)).status.code == 409)
        #expect(database.couchError(.io("disk full")).status.code == 503)
    }

    @Test func aTooManyRequestsAnswerIsRateLimitedNotUnavailable() {
        #expect(CouchError(.tooManyRequests, "too_many_requests", "slow down").failure == .rateLimited)
        #expect(CouchError(.serviceUnavailable, "unavailable", "busy").failure == .unavailable)
    }
}

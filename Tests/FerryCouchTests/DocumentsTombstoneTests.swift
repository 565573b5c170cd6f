import FerryCore
import Foundation
import Testing

@testable import FerryCouch

/// Reading deleted documents as Apache CouchDB 3.4 answers them.
@Suite struct DocumentsTombstoneTests {
    @Test func deletedTrueAnswersTheWinningTombstoneWith200() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let tombstone = try await c.send(.delete, "/ferry/a?rev=\(rev)").json["rev"]!.stringValue!
            let asked = try await c.get("/ferry/a?deleted=true")
            #expect(asked.status == .ok)
            #expect(asked.json == .object(["_id": "a", "_rev": .string(tombstone), "_deleted": true]))
            #expect(asked.headers[.eTag] == "\"\(tombstone)\"")
            // Without it, the document stays deleted; a live document ignores the parameter.
            #expect(try await c.get("/ferry/a").json == ["error": "not_found", "reason": "deleted"])
            _ = try await c.put("b", ["v": 2])
            #expect(try await c.get("/ferry/b?deleted=true").json["v"] == 2)
            #expect(try await c.get("/ferry/nope?deleted=true").status == .notFound)
            #expect(try await c.get("/ferry/a?deleted=maybe").status == .badRequest)
        }
    }

    @Test func revOfATombstoneAnswersItWith200() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let tombstone = try await c.send(.delete, "/ferry/a?rev=\(rev)").json["rev"]!.stringValue!
            let named = try await c.get("/ferry/a?rev=\(tombstone)&deleted=true")
            #expect(named.status == .ok)
            #expect(named.json == .object(["_id": "a", "_rev": .string(tombstone), "_deleted": true]))
        }
    }
}

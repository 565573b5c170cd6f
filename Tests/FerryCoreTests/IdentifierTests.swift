import Testing
@testable import FerryCore

@Suite struct DocumentIDTests {
    @Test func validIDsAreAccepted() throws {
        #expect(try DocumentID("a").rawValue == "a")
        #expect(try DocumentID("päivä/2026:x y").rawValue == "päivä/2026:x y")
        #expect(try DocumentID(String(repeating: "x", count: 250)).rawValue.count == 250)
    }

    @Test func badIDsAreRejectedWithAReason() {
        #expect(throws: DocumentIDError.empty) { try DocumentID("") }
        #expect(throws: DocumentIDError.tooLong(251)) { try DocumentID(String(repeating: "x", count: 251)) }
        #expect(throws: DocumentIDError.tooLong(252)) { try DocumentID(String(repeating: "é", count: 126)) }
        #expect(throws: DocumentIDError.controlCharacter) { try DocumentID("a\nb") }
        #expect(throws: DocumentIDError.reservedPrefix("_secret")) { try DocumentID("_secret") }
    }

    @Test func reservedPrefixesNeedExplicitPermission() throws {
        #expect(throws: DocumentIDError.self) { try DocumentID("_ferry/group") }
        #expect(try DocumentID("_ferry/group", allowReserved: true).rawValue == "_ferry/group")
        #expect(throws: DocumentIDError.self) { try DocumentID("_other", allowReserved: true) }
    }
}

@Suite struct RevisionIDTests {
    @Test func theSameEditYieldsTheSameRevisionID() throws {
        let body = try JSON.parse(#"{"b":2,"a":1}"#).canonicalBytes
        let other = try JSON.parse(#"{"a":1.0, "b":2}"#).canonicalBytes
        let r1 = RevisionID.compute(parent: nil, deleted: false, canonicalBody: body)
        let r2 = RevisionID.compute(parent: nil, deleted: false, canonicalBody: other)
        #expect(r1 == r2)
        #expect(r1.generation == 1)
        let child = RevisionID.compute(parent: r1, deleted: false, canonicalBody: body)
        #expect(child.generation == 2)
        #expect(child != r1)
        #expect(RevisionID.compute(parent: r1, deleted: true, canonicalBody: body) != child)
    }

    @Test func revisionIDsParseAndPrint() throws {
        let r = RevisionID.compute(parent: nil, deleted: false, canonicalBody: Array("{}".utf8))
        #expect(try RevisionID(r.description) == r)
        for bad in ["", "1", "1-", "0-" + r.hashText, "x-" + r.hashText, "1-" + r.hashText + "!", "1-a c", "-1-" + r.hashText] {
            #expect(throws: RevisionIDError.self, "\(bad)") { try RevisionID(bad) }
        }
    }

    @Test func aGenerationWithLeadingZerosIsReadAndPrintedCanonically() throws {
        let digest = String(repeating: "ab", count: 32)
        let r = try RevisionID("007-" + digest)
        #expect(r.generation == 7)
        #expect(r.description == "7-" + digest)
        #expect(r == (try RevisionID("7-" + digest)))
        #expect(r.hashText == digest)
        #expect(r.isFerryDigest)
        #expect(throws: RevisionIDError.self) { try RevisionID("+7-" + digest) }
        #expect(throws: RevisionIDError.self) { try RevisionID("2147483648-" + digest) }
        #expect(try RevisionID("2147483647-" + digest).generation == Int(Int32.max))
        // Near misses of Ferry's form are hashes made elsewhere, never Ferry digests.
        #expect(try RevisionID("7-" + digest + "0").form == .text)
        #expect(try RevisionID("7-" + String(digest.dropLast()) + "g").form == .text)
    }

    @Test func digestBytesRoundTrip() throws {
        let r = RevisionID.compute(parent: nil, deleted: false, canonicalBody: Array("{}".utf8))
        let bytes = try #require(r.ferryDigestBytes)
        #expect(bytes.count == 32)
        #expect(RevisionID(generation: 12, ferryDigestBytes: bytes) == (try RevisionID("12-" + r.hashText)))
        #expect(Hex.encode(bytes) == r.hashText)
    }

    @Test func orderIsGenerationThenDigest() throws {
        let a = try RevisionID("2-" + String(repeating: "0", count: 64))
        let b = try RevisionID("2-" + String(repeating: "f", count: 64))
        let c = try RevisionID("10-" + String(repeating: "0", count: 64))
        #expect(a < b)
        #expect(b < c)
    }
}

@Suite struct HybridLogicalClockTests {
    @Test func timestampsNeverGoBackwardsWhenTheWallClockDoes() {
        var clock = HybridLogicalClock()
        let t1 = clock.now(wallMillis: 1000)
        let t2 = clock.now(wallMillis: 900)
        let t3 = clock.now(wallMillis: 900)
        let t4 = clock.now(wallMillis: 2000)
        #expect(t1 < t2 && t2 < t3 && t3 < t4)
        #expect(t4.millis == 2000 && t4.counter == 0)
    }

    @Test func observingARemoteTimestampOrdersLaterEventsAfterIt() {
        var clock = HybridLogicalClock()
        _ = clock.now(wallMillis: 1000)
        let remote = HLCTimestamp(millis: 5000, counter: 7)
        clock.observe(remote, wallMillis: 1001)
        let next = clock.now(wallMillis: 1002)
        #expect(next > remote)
    }

    @Test func raisingToAPersistedFloorIsMonotonic() {
        var clock = HybridLogicalClock()
        clock.raise(to: HLCTimestamp(millis: 50, counter: 3))
        #expect(clock.now(wallMillis: 10) > HLCTimestamp(millis: 50, counter: 3))
    }
}

@Suite struct BlobReferenceTests {
    @Test func blobReferencesAreFoundAnywhereInABody() throws {
        let ref = BlobReference(digest: BlobDigest.of(Array("hello".utf8)), length: 5, contentType: "text/plain")
        let body: JSON = ["photo": ref.json, "list": [["x": 1], ref.json]]
        let found = try body.blobReferences()
        #expect(found.count == 2)
        #expect(found.allSatisfy { $0 == ref })
    }

    @Test func malformedBlobReferencesAreErrors() {
        let noDigest: JSON = ["@type": "blob", "length": 3]
        #expect(throws: BlobReferenceError.self) { try noDigest.blobReferences() }
        let badDigest: JSON = ["@type": "blob", "digest": "sha256-xyz", "length": 3]
        #expect(throws: BlobReferenceError.self) { try badDigest.blobReferences() }
    }
}

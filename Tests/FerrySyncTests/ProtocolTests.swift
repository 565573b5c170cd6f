import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

@Suite(.timeLimit(.minutes(10))) struct MessageCodecTests {
    @Test func envelopesRoundTrip() throws {
        let m = Message(
            kind: .request, number: 300, flags: Message.flagNoReply,
            properties: [("Profile", "getBlob"), ("Digest", "sha256-ab"), ("ünï", "cödé")], body: [0, 1, 2, 255])
        #expect(try Message(decoding: m.encoded()) == m)
        let e = Message.errorReply(to: 9, SyncError(.forbidden, message: "no", isTransient: false))
        let back = try Message(decoding: e.encoded())
        #expect(back.kind == .error)
        #expect(back.carriedError == SyncError(.forbidden, message: "no", isTransient: false))
    }

    @Test func malformedFramesGiveProtocolErrorsNeverCrashes() throws {
        #expect(throws: SyncError.self) { try Message(decoding: []) }
        #expect(throws: SyncError.self) { try Message(decoding: [0x00, 0, 1, 0, 0]) }
        #expect(throws: SyncError.self) { try Message(decoding: [0xFE, 9, 1, 0, 0]) }
        #expect(throws: SyncError.self) { try Message(decoding: [0xFE, 0, 1, 0, 0x7F]) }
        let valid = Message(kind: .response, number: 5, properties: [("a", "b")], body: Array("{}".utf8)).encoded()
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            var mutated = valid
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                mutated[Int.random(in: 0..<mutated.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            }
            if Bool.random(using: &rng) { mutated = Array(mutated.prefix(Int.random(in: 0...mutated.count, using: &rng))) }
            _ = try? Message(decoding: mutated)
        }
        for _ in 0..<2000 {
            let random = (0..<Int.random(in: 0..<40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            _ = try? Message(decoding: random)
        }
    }

    @Test func lengthFramingReassemblesAnyChunking() throws {
        let messages = (0..<50).map { i in Array(repeating: UInt8(i), count: i * 37) }
        let stream = messages.flatMap(LengthFramer.frame)
        var rng = SystemRandomNumberGenerator()
        var framer = LengthFramer()
        var out: [[UInt8]] = []
        var pos = 0
        while pos < stream.count {
            let n = Int.random(in: 1...300, using: &rng)
            out += try framer.feed(stream[pos..<min(pos + n, stream.count)])
            pos += n
        }
        #expect(out == messages)
    }

    @Test func revisionMetadataIsWrittenAsItsCanonicalJSON() throws {
        let rev = "2-" + String(repeating: "c", count: 64)
        let base = "1-" + String(repeating: "d", count: 64)
        let cases: [WireRevision] = [
            WireRevision(id: "plain", rev: rev, history: [base], deleted: false, hlc: 42, content: [], deltaBase: nil),
            WireRevision(id: "q\"uote\\é\u{1}", rev: rev, history: [base, base], deleted: true, hlc: UInt64.max, content: [], deltaBase: base),
            WireRevision(id: "first", rev: rev, history: [], deleted: false, hlc: 0, content: [], deltaBase: base),
            .missing(id: "gone", rev: rev),
        ]
        for wire in cases {
            var out: [UInt8] = []
            wire.writeMetadata(into: &out)
            #expect(out == wire.metadata.canonicalBytes, "\(String(decoding: out, as: UTF8.self))")
        }
        let decoded = try WireRevision.decodeBatch(WireRevision.encodeBatch(cases))
        #expect(decoded.map(\.id) == cases.map(\.id))
        #expect(decoded[1].deltaBase == base && decoded[1].deleted && decoded[1].hlc == UInt64.max)
        #expect(decoded[3].missing)
    }

    @Test func anOversizedFrameIsRefused() {
        var framer = LengthFramer(maximumMessageSize: 100)
        #expect(throws: SyncError.self) { try framer.feed(LengthFramer.frame(Array(repeating: 1, count: 101))) }
    }

    @Test func aPeerSendingGarbageIsDisconnectedWithAProtocolError() async throws {
        let store = try DocumentStore.inMemory()
        let responder = ReplicationResponder(store: store)
        let (client, server) = InMemoryEndpoint.pair()
        let served = Task { await responder.serve(server) }
        try await client.send([1, 2, 3])
        await served.value
        var error: (any Error)?
        do { for try await _ in client.incoming {} } catch let e { error = e }
        #expect((error as? SyncError)?.code == "protocol_error")
    }
}

@Suite(.timeLimit(.minutes(10))) struct JSONDeltaTests {
    @Test func deltasRoundTripRandomEdits() throws {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 {
            var base: [String: JSON] = [:]
            for i in 0..<8 { base["k\(i)"] = .int(Int64.random(in: 0..<5, using: &rng)) }
            base["nested"] = ["a": 1, "b": ["c": 2]]
            var target = base
            for i in 0..<8 where Bool.random(using: &rng) {
                switch Int.random(in: 0..<3, using: &rng) {
                case 0: target.removeValue(forKey: "k\(i)")
                case 1: target["k\(i)"] = .string("changed")
                default: target["new\(i)"] = [1, 2]
                }
            }
            if Bool.random(using: &rng) { target["nested"] = ["a": 1, "b": ["c": 3, "d": 4]] }
            let delta = JSONDelta.diff(from: base, to: target)
            #expect(try JSONDelta.apply(delta, to: base) == target)
        }
    }

    @Test func malformedOrMisfittingDeltasAreErrors() {
        #expect(throws: SyncError.self) { try JSONDelta.apply("x", to: [:]) }
        #expect(throws: SyncError.self) { try JSONDelta.apply(["bogus": 1], to: [:]) }
        #expect(throws: SyncError.self) { try JSONDelta.apply(["del": ["missing"]], to: ["a": 1]) }
        #expect(throws: SyncError.self) { try JSONDelta.apply(["sub": ["a": ["set": ["b": 1]]]], to: ["a": 1]) }
    }

    @Test func aOneFieldEditOfALargeDocumentIsATinyDelta() {
        let base: [String: JSON] = ["text": .string(String(repeating: "z", count: 8000)), "n": 1]
        var target = base
        target["n"] = 2
        let delta = JSONDelta.diff(from: base, to: target)
        #expect(delta.canonicalBytes.count < 40)
    }
}

@Suite(.timeLimit(.minutes(10))) struct PolicyTests {
    @Test func globsMatchWholeIDs() {
        #expect(Glob.matches("orders/*", "orders/1"))
        #expect(Glob.matches("*/2026-??-*", "log/2026-11-22"))
        #expect(!Glob.matches("orders/*", "xorders/1"))
        #expect(!Glob.matches("a?c", "abbc"))
        #expect(Glob.matches("*", ""))
    }

    @Test func accessRulesAdmitByPrefixPatternOrType() throws {
        let rule = AccessRule(idPrefixes: ["p/"], idPatterns: ["*.cfg"], types: ["order"])
        #expect(rule.admits(id: docID("p/1"), body: nil))
        #expect(rule.admits(id: docID("x.cfg"), body: nil))
        #expect(rule.admits(id: docID("o"), body: ["type": "order"]))
        #expect(!rule.admits(id: docID("o"), body: ["type": "note"]))
        #expect(AccessRule.all.admits(id: docID("any"), body: nil))
        #expect(!AccessRule.none.admits(id: docID("any"), body: nil))
    }
}

@Suite(.timeLimit(.minutes(10))) struct ByteStreamEndpointTests {
    @Test func replicationRunsOverAFramedByteStream() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for i in 0..<200 { try a.put(docID("a\(i)"), body: ["n": .int(Int64(i)), "pad": .string(String(repeating: "p", count: i * 10))]) }
        for i in 0..<50 { try b.put(docID("b\(i)"), body: ["n": .int(Int64(i))]) }
        let responder = ReplicationResponder(store: b)
        let r = Replicator(
            store: a,
            connector: {
                let (client, server) = InMemoryByteStream.pair(maxChunk: 7)
                let serverEnd = FramedEndpoint(server)
                Task { await responder.serve(serverEnd) }
                return FramedEndpoint(client)
            }, clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(try digest(a) == digest(b))
        #expect(try b.documentCount == 250)
    }
}

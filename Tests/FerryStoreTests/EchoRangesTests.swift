import FerryCore
import Foundation
import Testing
@testable import FerryStore

@Suite struct EchoRangesTests {
    @Test func rangesMergeWhenTheyTouchAndAnswerMembership() {
        var r = EchoRanges()
        r.add(10...20)
        r.add(21...25)
        r.add(40...41)
        r.add(5...9)
        #expect(r.ranges == [5...25, 40...41])
        #expect(r.contains(5) && r.contains(25) && r.contains(41))
        #expect(!r.contains(4) && !r.contains(26) && !r.contains(39) && !r.contains(42))
        r.add(1...100)
        #expect(r.ranges == [1...100])
    }

    @Test func theOldestRangesGoWhenFull() {
        var r = EchoRanges()
        for i in 0..<(EchoRanges.maxRanges + 10) { r.add(UInt64(i * 10 + 1)...UInt64(i * 10 + 5)) }
        #expect(r.ranges.count == EchoRanges.maxRanges)
        #expect(!r.contains(1) && r.contains(UInt64((EchoRanges.maxRanges + 9) * 10 + 1)))
    }

    @Test func anInsertRecordsItsSequencesOnlyWhenNoDocumentBranched() throws {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        var incoming: [IncomingRevision] = []
        for i in 0..<3 {
            let rev = try source.put(try DocumentID("d\(i)"), body: ["i": .int(Int64(i))])
            incoming.append(IncomingRevision(id: try DocumentID("d\(i)"), revision: rev, history: [], deleted: false, body: ["i": .int(Int64(i))]))
        }
        try target.put(try DocumentID("other"), body: [:])
        _ = try target.insertRevisions(incoming, echoKey: "k")
        #expect(try target.echoRanges("k").ranges == [2...4])
        // A revision that branches a document: nothing is recorded for its batch.
        try target.put(try DocumentID("x"), body: ["v": 0])
        let theirs = try source.put(try DocumentID("x"), body: ["v": 1])
        let branch = IncomingRevision(id: try DocumentID("x"), revision: theirs, history: [], deleted: false, body: ["v": 1])
        let clean = try source.put(try DocumentID("y"), body: ["v": 2])
        let outcomes = try target.insertRevisions(
            [branch, IncomingRevision(id: try DocumentID("y"), revision: clean, history: [], deleted: false, body: ["v": 2])], echoKey: "k")
        #expect(outcomes.allSatisfy { if case .inserted = $0 { return true } else { return false } })
        #expect(try target.echoRanges("k").ranges == [2...4])
    }
}

import FerryCore
import Testing

@testable import FerrySync

@Suite struct AccessRuleRecordTests {
    @Test func aRuleWithItsGroupGrantSurvivesItsRecordAndJudgesAlike() throws {
        let grant = AccessGrant(
            clauses: [try AccessClause(idPatterns: ["ward-a/*"], selector: ["type": "visit"]), try AccessClause(idPatterns: ["shared-*"])],
            also: [AccessGrant(clauses: [try AccessClause(selector: ["urgent": ["$ne": true]])])])
        let rule = AccessRule(idPrefixes: ["ward-"], idPatterns: ["x-?"], types: ["note"], grant: grant)
        let back = try AccessRule(record: JSON.parse(rule.record.canonicalBytes))
        #expect(back == rule && back.fingerprint == rule.fingerprint)
        let visit: JSON = ["type": "visit", "urgent": false]
        let urgent: JSON = ["type": "visit", "urgent": true]
        for (id, body) in [("ward-a/1", visit), ("ward-a/2", urgent), ("shared-1", ["type": "note"]), ("x-1", visit)] {
            let docID = try DocumentID(id)
            #expect(back.admits(id: docID, body: body) == rule.admits(id: docID, body: body), "\(id)")
        }
        #expect(try AccessRule(record: AccessRule.all.record) == .all)
        #expect(try AccessRule(record: AccessRule.none.record) == .none)
    }

    @Test func aMalformedRecordIsRefusedWithItsReason() {
        #expect(throws: SyncError.self) { try AccessRule(record: "all") }
        #expect(throws: SyncError.self) { try AccessRule(record: ["ids": "x-*"]) }
        #expect(throws: SyncError.self) { try AccessRule(record: ["grant": ["clauses": [["selector": ["$bogus": 1]]]]]) }
        #expect(throws: SyncError.self) { try AccessRule(record: ["grant": ["also": []]]) }
    }
}

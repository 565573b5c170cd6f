import FerryCore
@testable import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Testing

@testable import FerryNode

/// A founded group (node `a`, its founder and admin) with member `b` joined, for access tests.
enum AccessFixture {
    static func group() throws -> (a: FerryNode, b: FerryNode) {
        let a = try MembershipFixture.node("a")
        let b = try MembershipFixture.node("b")
        let invitation = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let request: JSON = ["secret": .string(Base64URL.encode(invitation.code.secret)), "database": "ferry", "addresses": ["127.0.0.1:5000"], "name": "b"]
        let reply = try a.membership.acceptJoin(request, peer: b.identity.nodeID)
        _ = try b.membership.finishJoin(
            Message(kind: .response, number: 1, body: reply.canonicalBytes), inviter: a.identity.nodeID, address: "127.0.0.1:4985",
            context: b.membership.context)
        return (a, b)
    }

    static func doc(_ id: String) -> DocumentID { try! DocumentID(id) }

    /// The clinic: `a` supervises (reads and writes all), `b` is ward a's station.
    static func clinic() throws -> (a: FerryNode, b: FerryNode) {
        let (a, b) = try group()
        _ = try a.access.setRoles("a", roles: ["supervisor"], membership: a.membership)
        _ = try a.access.setRule("all", roles: ["supervisor"], read: AccessMatch(), write: AccessMatch(), delete: true, membership: a.membership)
        _ = try a.access.setRule(
            "ward-a", roles: ["ward-a"], read: AccessMatch(selector: ["ward": "a"]), write: AccessMatch(selector: ["ward": "a"]),
            delete: false, membership: a.membership)
        _ = try a.access.setRoles(b.identity.nodeID, roles: ["ward-a"], membership: a.membership)
        return (a, b)
    }
}

@Suite struct AccessEntryTests {
    @Test func aSignedRuleSurvivesItsBodyAndAnAlteredOneFailsItsSignature() throws {
        let admin = try MembershipFixture.identity()
        var rule = try AccessRuleEntry.signed(
            group: admin.nodeID, name: "ward-a", roles: ["ward-a"], read: AccessMatch(ids: ["patient-*"], selector: ["ward": "a"]),
            write: nil, delete: false, state: .active, version: 1, by: admin)
        let parsed = try AccessRuleEntry(parsing: rule.body)
        #expect(parsed == rule)
        try parsed.verifySignature()
        rule.roles = ["ward-a", "ward-b"]
        #expect(throws: AccessError.self) { try rule.verifySignature() }
    }

    @Test func invalidSelectorsNamesAndPrincipalsAreRefusedWithTheReason() throws {
        let admin = try MembershipFixture.identity()
        let bad = Result { () throws(AccessError) in
            try AccessRuleEntry.signed(
                group: admin.nodeID, name: "x", roles: ["r"], read: AccessMatch(selector: ["ward": ["$nope": 1]]), write: nil, delete: false,
                state: .active, version: 1, by: admin)
        }
        if case .failure(let e) = bad { #expect(e.code == "invalid_selector", "\(e)") } else { Issue.record("an invalid selector was signed") }
        #expect(throws: AccessError.self) {
            try AccessRuleEntry.signed(group: admin.nodeID, name: "a b", roles: ["r"], read: AccessMatch(), write: nil, delete: false, state: .active, version: 1, by: admin)
        }
        #expect(throws: AccessError.self) { try RoleAssignment.signed(group: admin.nodeID, principal: "nobody", roles: ["r"], version: 1, by: admin) }
        let user = try RoleAssignment.signed(group: admin.nodeID, principal: "user:nurse", roles: ["r"], version: 1, by: admin)
        #expect(try RoleAssignment(parsing: user.body) == user)
        var body = user.body.objectValue!
        body["extra"] = true
        #expect(throws: AccessError.malformed("unknown member \"extra\"")) { try RoleAssignment(parsing: .object(body)) }
    }
}

@Suite(.timeLimit(.minutes(2))) struct GroupAccessTests {
    @Test func withoutRulesEveryPolicyIsUnchanged() throws {
        let (a, b) = try AccessFixture.group()
        #expect(a.access.version == "none")
        #expect(a.trust.policy(for: b.identity.nodeID) == .trusted)
        // Roles before any rule change nothing either.
        _ = try a.access.setRoles("b", roles: ["ward-a"], membership: a.membership)
        #expect(a.access.version == "none")
        #expect(a.trust.policy(for: b.identity.nodeID) == .trusted)
    }

    @Test func aMemberReadsAndWritesWhatItsRolesRulesAdmitAndAUserToo() throws {
        let (a, b) = try AccessFixture.clinic()
        let policy = try #require(a.trust.policy(for: b.identity.nodeID))
        let access = DocumentAccess(policy)
        #expect(policy.read.admits(id: AccessFixture.doc("p1"), body: ["ward": "a"]))
        #expect(!policy.read.admits(id: AccessFixture.doc("p2"), body: ["ward": "b"]))
        #expect(!policy.mayDelete)
        #expect(access.writeRefusal(id: AccessFixture.doc("p2"), body: ["ward": "b"], deleted: false, ancestors: [], existing: nil) != nil)
        #expect(access.writeRefusal(id: AccessFixture.doc("p1"), body: ["ward": "a"], deleted: false, ancestors: [], existing: nil) == nil)
        // The supervisor reads everything: no restriction at all.
        #expect(a.access.restrict(.trusted, principal: a.identity.nodeID).read.admitsEverything)
        // A CouchDB user without roles gets nothing once rules exist; with ward-a, ward a.
        #expect(!a.access.restrict(.trusted, principal: "user:nurse").read.admits(id: AccessFixture.doc("p1"), body: ["ward": "a"]))
        _ = try a.access.setRoles("user:nurse", roles: ["ward-a"], membership: a.membership)
        let nurse = a.access.restrict(.trusted, principal: "user:nurse")
        #expect(nurse.read.admits(id: AccessFixture.doc("p1"), body: ["ward": "a"]))
        #expect(!nurse.read.admits(id: AccessFixture.doc("p1"), body: ["ward": "b"]))
    }

    @Test func aManualPolicyAndTheGroupsRulesCombineByIntersection() throws {
        let (a, b) = try AccessFixture.clinic()
        let manual = PeerPolicy(read: AccessRule(idPatterns: ["p-*"]), write: .all, mayDelete: true)
        let combined = a.access.restrict(manual, principal: b.identity.nodeID)
        #expect(combined.read.admits(id: AccessFixture.doc("p-1"), body: ["ward": "a"]))
        #expect(!combined.read.admits(id: AccessFixture.doc("q-1"), body: ["ward": "a"]), "the manual policy still holds")
        #expect(!combined.read.admits(id: AccessFixture.doc("p-1"), body: ["ward": "b"]), "the group's rule still holds")
        #expect(!combined.mayDelete)
        #expect(combined.read.fingerprint != manual.read.fingerprint, "a rule change restarts the checkpoints")
    }

    @Test func idGlobsAndASelectorInOneRuleMustBothMatchAndTwoRulesEitherMay() throws {
        let (a, b) = try AccessFixture.clinic()
        _ = try a.access.setRule(
            "manuals", roles: ["ward-a"], read: AccessMatch(ids: ["manual-*"], selector: ["public": true]), write: nil, delete: false,
            membership: a.membership)
        let read = a.access.restrict(.trusted, principal: b.identity.nodeID).read
        #expect(read.admits(id: AccessFixture.doc("manual-1"), body: ["public": true]))
        #expect(!read.admits(id: AccessFixture.doc("manual-1"), body: ["public": false]))
        #expect(!read.admits(id: AccessFixture.doc("other"), body: ["public": true]))
        #expect(read.admits(id: AccessFixture.doc("other"), body: ["ward": "a"]), "the ward-a rule still admits it")
    }

    @Test func theValidatorTakesOnlyAdminSignedEntriesOfTheGroup() throws {
        let (a, b) = try AccessFixture.group()
        let group = a.identity.nodeID
        let byAdmin = try AccessRuleEntry.signed(
            group: group, name: "r", roles: ["x"], read: AccessMatch(), write: nil, delete: false, state: .active, version: 1, by: a.identity)
        let byMember = try AccessRuleEntry.signed(
            group: group, name: "r", roles: ["x"], read: AccessMatch(), write: nil, delete: false, state: .active, version: 2, by: b.identity)
        let stranger = try MembershipFixture.identity()
        let otherGroup = try AccessRuleEntry.signed(
            group: stranger.nodeID, name: "r", roles: ["x"], read: AccessMatch(), write: nil, delete: false, state: .active, version: 1, by: stranger)
        func proposed(_ body: JSON, deleted: Bool = false, id: String = "_ferry/access/rules/r") -> ProposedRevision {
            ProposedRevision(id: try! DocumentID(id, allowReserved: true), revision: try! RevisionID("1-" + String(repeating: "a", count: 64)), deleted: deleted, body: body, origin: .replicated)
        }
        #expect(b.membership.ledger.validate(proposed(byAdmin.body)) == nil)
        #expect(b.membership.ledger.validate(proposed(byMember.body))?.contains("neither the founder nor an active admin") == true)
        #expect(b.membership.ledger.validate(proposed(otherGroup.body))?.contains("not this node's") == true)
        #expect(b.membership.ledger.validate(proposed(byAdmin.body, deleted: true))?.contains("never deleted") == true)
        #expect(b.membership.ledger.validate(proposed(byAdmin.body, id: "_ferry/access/rules/other"))?.contains("not its document's") == true)
        var tampered = byAdmin.body.objectValue!
        tampered["roles"] = ["y"]
        #expect(b.membership.ledger.validate(proposed(.object(tampered))) != nil)
        // And end to end: a non-admin cannot change rules through its node at all.
        #expect(throws: AccessError.self) {
            try b.access.setRule("grab", roles: ["x"], read: AccessMatch(), write: nil, delete: false, membership: b.membership)
        }
    }

    @Test func badChangesAreRefusedAndNothingStoredChanges() throws {
        let (a, b) = try AccessFixture.clinic()
        let before = a.access.version
        let stored = try a.store.info().lastSequence
        // An unknown role, once rules exist.
        #expect(throws: AccessError.unknownRole("pharmacy")) { try a.access.setRoles("b", roles: ["pharmacy"], membership: a.membership) }
        // Taking the only admin's read-everything role away, or its rule, would lock every admin out.
        #expect(throws: AccessError.self) { try a.access.setRoles("a", roles: ["ward-a"], membership: a.membership) }
        #expect(throws: AccessError.self) { try a.access.removeRule("all", membership: a.membership) }
        #expect(throws: AccessError.unknownRule("nope")) { try a.access.removeRule("nope", membership: a.membership) }
        // A member that is not in the group.
        #expect(throws: MembershipError.self) { try a.access.setRoles("zzzzzzzzzz", roles: ["ward-a"], membership: a.membership) }
        // A rule granting nothing, and delete without write.
        #expect(throws: AccessError.self) { try a.access.setRule("none", roles: ["x"], read: nil, write: nil, delete: false, membership: a.membership) }
        #expect(throws: AccessError.self) { try a.access.setRule("d", roles: ["x"], read: AccessMatch(), write: nil, delete: true, membership: a.membership) }
        #expect(a.access.version == before)
        #expect(try a.store.info().lastSequence == stored)
        _ = b
    }

    @Test func aRuleStopsCountingWhenItsSignerIsNoLongerAnAdmin() throws {
        let a = try MembershipFixture.node("a")
        let b = try MembershipFixture.node("b")
        let invitation = try a.membership.invite(admin: true, lifetime: 60, addresses: nil)
        let request: JSON = ["secret": .string(Base64URL.encode(invitation.code.secret)), "database": "ferry", "addresses": ["127.0.0.1:5000"], "name": "b"]
        _ = try a.membership.acceptJoin(request, peer: b.identity.nodeID)
        _ = try a.access.setRoles("a", roles: ["supervisor"], membership: a.membership)
        _ = try a.access.setRule("all", roles: ["supervisor"], read: AccessMatch(), write: AccessMatch(), delete: true, membership: a.membership)
        // B, an admin, signs a rule; it reaches A as replication would.
        let byB = try AccessRuleEntry.signed(
            group: a.identity.nodeID, name: "notes", roles: ["clerk"], read: AccessMatch(ids: ["note-*"]), write: nil, delete: false,
            state: .active, version: 1, by: b.identity)
        try a.store.put(AccessRuleEntry.documentID("notes"), body: byB.body)
        try a.access.reread([AccessRuleEntry.documentID("notes")], from: a.store)
        a.access.recompute()
        #expect(a.access.snapshot.rules["notes"] != nil)
        // B is removed: what it signed no longer counts, and a new entry it signs is refused.
        _ = try a.membership.remove("b")
        a.access.recompute()
        #expect(a.access.snapshot.rules["notes"] == nil)
        let later = try AccessRuleEntry.signed(
            group: a.identity.nodeID, name: "more", roles: ["clerk"], read: AccessMatch(), write: nil, delete: false, state: .active,
            version: 1, by: b.identity)
        #expect(throws: StoreError.self) { try a.store.put(AccessRuleEntry.documentID("more"), body: later.body) }
    }

    @Test func aRemovedMemberKeepsNoRole() throws {
        let (a, b) = try AccessFixture.clinic()
        #expect(a.access.snapshot.roles[b.identity.nodeID] == ["ward-a"])
        _ = try a.membership.remove("b")
        a.access.recompute()
        #expect(a.access.snapshot.roles[b.identity.nodeID] == nil)
        #expect(!a.access.restrict(.trusted, principal: b.identity.nodeID).read.admits(id: AccessFixture.doc("p"), body: ["ward": "a"]))
    }

    @Test func explainNamesTheAdmittingRuleOrSaysWhyNone() throws {
        let (a, b) = try AccessFixture.clinic()
        try a.store.put(AccessFixture.doc("p2"), body: ["ward": "b"])
        let no = try a.access.explain(AccessFixture.doc("p2"), body: nil, who: "b", membership: a.membership, store: a.store)
        #expect(!no.read.allowed && no.read.reason.contains("ward-a"), "\(no)")
        let yes = try a.access.explain(AccessFixture.doc("p2"), body: ["ward": "a"], who: b.identity.nodeID, membership: a.membership, store: a.store)
        #expect(yes.read.allowed && yes.read.by == "ward-a" && yes.write.allowed && !yes.delete, "\(yes)")
        let user = try a.access.explain(AccessFixture.doc("p2"), body: nil, who: "user:ghost", membership: a.membership, store: a.store)
        #expect(!user.read.allowed && user.read.reason.contains("no roles"))
        #expect(throws: StoreError.self) { try a.access.explain(AccessFixture.doc("missing"), body: nil, who: "b", membership: a.membership, store: a.store) }
    }

    @Test func aNodeHoldsAndWritesOnlyWhatItsRolesAdmitAndPurgesWhatItLoses() throws {
        let (a, b) = try AccessFixture.clinic()
        // B learns the rules as replication would bring them.
        for id in try GroupAccess.documentIDs(in: a.store) {
            let doc = try #require(try a.store.document(id))
            let tree = try #require(try a.store.revisionTree(id))
            let history = Array(tree.history(of: doc.revision).dropFirst())
            let rev = try #require(IncomingRevision.verified(
                id: id, revision: doc.revision, history: history, deleted: false, body: doc.body, hlc: HLCTimestamp(rawValue: 0),
                canonicalBody: doc.body.canonicalBytes))
            _ = try b.store.insertRevisions([rev])
        }
        try b.access.load(from: b.store)
        b.access.recompute()
        #expect(b.access.version == a.access.version)
        try b.store.put(AccessFixture.doc("p1"), body: ["ward": "a"])
        #expect(throws: StoreError.self) { try b.store.put(AccessFixture.doc("p2"), body: ["ward": "b"]) }
        // Its role taken away (as replicated), it purges what it held, and refuses the purged revision back.
        let revision = try #require(try b.store.document(AccessFixture.doc("p1"))?.revision)
        let withdrawn = try RoleAssignment.signed(group: a.identity.nodeID, principal: b.identity.nodeID, roles: [], version: 9, by: a.identity)
        let id = RoleAssignment.documentID(b.identity.nodeID)
        try b.store.put(id, body: withdrawn.body, parent: try b.store.document(id)?.revision)
        try b.access.reread([id], from: b.store)
        #expect(b.access.recompute() != nil)
        let removed = try b.access.purgeUnreadable(in: b.store, logger: b.logger)
        #expect(removed.map(\.id) == ["p1"])
        #expect(try b.store.document(AccessFixture.doc("p1")) == nil)
        #expect(try b.store.accessRemovals().total == 1)
        let back = try #require(IncomingRevision.verified(
            id: AccessFixture.doc("p1"), revision: revision, history: [], deleted: false, body: ["ward": "a"], hlc: HLCTimestamp(rawValue: 0),
            canonicalBody: JSON.object(["ward": "a"]).canonicalBytes))
        let outcome = try b.store.insertRevisions([back])
        #expect("\(outcome)".contains("do not let it hold"), "\(outcome)")
    }

    @Test func aReplayedWithdrawnRoleOrRemovedRuleIsRefusedAndChangesNothing() throws {
        let (a, b) = try AccessFixture.clinic()
        let rolesID = RoleAssignment.documentID(b.identity.nodeID), ruleID = AccessRuleEntry.documentID("ward-a")
        // The station kept both bodies while they were current.
        let oldRoles = try #require(try a.store.document(rolesID)).body
        let oldRule = try #require(try a.store.document(ruleID)).body
        _ = try a.access.setRoles("b", roles: [], membership: a.membership)
        _ = try a.access.removeRule("ward-a", membership: a.membership)
        let withdrawn = a.access.snapshot
        #expect(withdrawn.roles[b.identity.nodeID] == nil && withdrawn.rules["ward-a"] == nil)
        // Pushed back as a child of the current revision, as a conflict branch, or a tombstone: all refused.
        for (id, body) in [(rolesID, oldRoles), (ruleID, oldRule)] {
            let child = Replay.rejected(try Replay.push(body, to: id, in: a.store))
            #expect(child?.contains("superseded") == true, "\(String(describing: child))")
            #expect(Replay.rejected(try Replay.push(body, to: id, in: a.store, as: .branch))?.contains("superseded") == true)
            #expect(Replay.rejected(try Replay.push(body, to: id, in: a.store, deleted: true))?.contains("never deleted") == true)
        }
        // Nor may the admin's own node delete one: a removal is a signed entry.
        let current = try #require(try a.store.document(rolesID)).revision
        #expect(throws: StoreError.self) { try a.store.delete(rolesID, revision: current) }
        try a.access.load(from: a.store)
        a.access.recompute()
        #expect(a.access.snapshot == withdrawn)
    }

    @Test func aReplayThatSlippedIntoATreeCountsForNothingAfterARestart() throws {
        let (a, b) = try AccessFixture.clinic()
        let id = RoleAssignment.documentID(b.identity.nodeID)
        let granted = try #require(try a.store.document(id)).body
        _ = try a.access.setRoles("b", roles: [], membership: a.membership)
        let withdrawn = try #require(try a.store.document(id)).body
        // A tree that went back to the old body, the withdrawal's body pruned: nothing checked it.
        let tree = try Replay.bareStore()
        for body in [granted, withdrawn, granted, granted, granted] { _ = try Replay.push(body, to: id, in: tree) }
        #expect(try tree.document(id)?.body == granted)
        // A node reading that tree with what it remembers (DATA/signed-entries.json) keeps the withdrawal.
        let ledger = try MembershipLedger(dataDirectory: a.dataDirectory)
        let restarted = GroupAccess(ledger: ledger, nodeID: a.identity.nodeID)
        try restarted.load(from: tree)
        restarted.recompute()
        #expect(restarted.snapshot.roles[b.identity.nodeID] == nil)
        #expect(restarted.snapshot.rules == a.access.snapshot.rules)
    }

    @Test func anAdminsNextEntryGoesAboveTheHighestVersionKnownNotTheTreesWinner() throws {
        let (a, b) = try AccessFixture.clinic()
        let id = RoleAssignment.documentID(b.identity.nodeID)
        // A higher version arrives on a branch that loses the tree (generation 1 against 2).
        _ = try a.access.setRoles("b", roles: ["ward-a"], membership: a.membership)
        let high = try RoleAssignment.signed(group: a.identity.nodeID, principal: b.identity.nodeID, roles: [], version: 9, by: a.identity)
        #expect(Replay.rejected(try Replay.push(high.body, to: id, in: a.store, as: .root)) == nil)
        try a.access.reread([id], from: a.store)
        a.access.recompute()
        #expect(try RoleAssignment(parsing: try #require(try a.store.document(id)).body).version == 2, "the tree shows the older entry")
        #expect(a.access.snapshot.roles[b.identity.nodeID] == nil, "version 9 counts")
        let next = try a.access.setRoles("b", roles: ["ward-a"], membership: a.membership)
        #expect(next.version == 10)
        #expect(a.access.snapshot.roles[b.identity.nodeID] == ["ward-a"])
        let rule = try a.access.setRule("ward-a", roles: ["ward-a"], read: AccessMatch(), write: nil, delete: false, membership: a.membership)
        #expect(rule.version == 2)
    }
}

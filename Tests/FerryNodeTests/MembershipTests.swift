import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

@testable import FerryNode

/// Fresh identities and nodes in temporary directories.
enum MembershipFixture {
    static func tempDir() -> String {
        let d = NSTemporaryDirectory() + "ferry-group-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    static func identity() throws -> NodeIdentity { try NodeIdentity.loadOrCreate(directory: tempDir()) }

    static func node(_ name: String) throws -> FerryNode {
        var c = NodeConfiguration()
        c.name = name
        c.discovery = false
        c.interface = "127.0.0.1"
        let node = try FerryNode(configuration: c, dataDirectory: tempDir())
        node.listenerPort.set(4985)  // as the listener does once bound
        return node
    }

    static func entry(
        group: NodeIdentity, node: String, state: MemberEntry.State = .member, admin: Bool = false, version: Int64 = 1,
        by signer: NodeIdentity? = nil
    ) throws -> MemberEntry {
        try MemberEntry.signed(
            group: group.nodeID, node: node, name: nil, state: state, admin: admin, version: version, addresses: [], by: signer ?? group)
    }
}

@Suite struct MemberEntryTests {
    @Test func signedEntryVerifiesAndSurvivesItsDocumentBody() throws {
        let founder = try MembershipFixture.identity()
        let e = try MemberEntry.signed(
            group: founder.nodeID, node: founder.nodeID, name: "a", state: .member, admin: true, version: 1,
            addresses: ["127.0.0.1:4985"], by: founder)
        try e.verifySignature()
        let parsed = try MemberEntry(parsing: e.body)
        #expect(parsed == e)
        try parsed.verifySignature()
    }

    @Test func alteredBodyFailsTheSignatureCheck() throws {
        let founder = try MembershipFixture.identity()
        var e = try MembershipFixture.entry(group: founder, node: String(repeating: "b", count: 64))
        e.admin = true
        #expect(throws: MembershipError.self) { try e.verifySignature() }
        #expect(MembershipView(group: founder.nodeID, entries: [e]).selected.isEmpty)
    }

    @Test func signerCertificateOfAnotherNodeFailsTheSignatureCheck() throws {
        let founder = try MembershipFixture.identity()
        let other = try MembershipFixture.identity()
        var e = try MembershipFixture.entry(group: founder, node: other.nodeID)
        e.signerCertificate = other.certificateDER
        do {
            try e.verifySignature()
            Issue.record("a foreign certificate passed")
        } catch {
            #expect(error.description.contains("not the certificate of signer"))
        }
        // Claiming the other node as signer with its certificate: the signature is still the founder's.
        e.signer = other.nodeID
        #expect(throws: MembershipError.self) { try e.verifySignature() }
    }

    @Test func malformedBodiesAreRefusedWithTheReason() throws {
        let founder = try MembershipFixture.identity()
        var body = try MembershipFixture.entry(group: founder, node: founder.nodeID).body.objectValue!
        body["version"] = .string("1")
        #expect(throws: MembershipError.malformedEntry("\"version\" is not a positive integer")) { try MemberEntry(parsing: .object(body)) }
        body["version"] = 1
        body["extra"] = true
        #expect(throws: MembershipError.malformedEntry("unknown member \"extra\"")) { try MemberEntry(parsing: .object(body)) }
        #expect(throws: MembershipError.self) { try MemberEntry(parsing: .array([])) }
    }
}

@Suite struct MembershipViewTests {
    @Test func entrySignedByNonAdminMemberDoesNotCount() throws {
        let founder = try MembershipFixture.identity()
        let plain = try MembershipFixture.identity()
        let newcomer = String(repeating: "c", count: 64)
        let entries = [
            try MembershipFixture.entry(group: founder, node: founder.nodeID, admin: true),
            try MembershipFixture.entry(group: founder, node: plain.nodeID, admin: false),
            try MembershipFixture.entry(group: founder, node: newcomer, by: plain),
        ]
        let view = MembershipView(group: founder.nodeID, entries: entries)
        #expect(view.isActiveMember(plain.nodeID))
        #expect(!view.isActiveMember(newcomer))
        #expect(!view.counts(entries[2]))
    }

    @Test func entrySignedByAnAdminCountsAndOfAnotherGroupDoesNot() throws {
        let founder = try MembershipFixture.identity()
        let admin = try MembershipFixture.identity()
        let elsewhere = try MembershipFixture.identity()
        let newcomer = String(repeating: "d", count: 64)
        let view = MembershipView(group: founder.nodeID, entries: [
            try MembershipFixture.entry(group: founder, node: admin.nodeID, admin: true),
            try MembershipFixture.entry(group: founder, node: newcomer, by: admin),
            try MembershipFixture.entry(group: elsewhere, node: String(repeating: "e", count: 64)),
        ])
        #expect(view.isActiveMember(newcomer))
        #expect(view.selected[String(repeating: "e", count: 64)] == nil)
    }

    @Test func removingAnAdminVoidsTheEntriesItSigned() throws {
        let founder = try MembershipFixture.identity()
        let admin = try MembershipFixture.identity()
        let newcomer = String(repeating: "f", count: 64)
        var entries = [
            try MembershipFixture.entry(group: founder, node: admin.nodeID, admin: true),
            try MembershipFixture.entry(group: founder, node: newcomer, by: admin),
        ]
        #expect(MembershipView(group: founder.nodeID, entries: entries).isActiveMember(newcomer))
        entries.append(try MembershipFixture.entry(group: founder, node: admin.nodeID, state: .removed, version: 2))
        let view = MembershipView(group: founder.nodeID, entries: entries)
        #expect(!view.isActiveMember(admin.nodeID))
        #expect(!view.isActiveMember(newcomer))
        #expect(!view.isAdmin(admin.nodeID))
    }

    @Test func highestVersionWinsAndRemovedBeatsMemberAtEqualVersion() throws {
        let founder = try MembershipFixture.identity()
        let node = String(repeating: "a", count: 64)
        let v1 = try MembershipFixture.entry(group: founder, node: node, version: 1)
        let v2removed = try MembershipFixture.entry(group: founder, node: node, state: .removed, version: 2)
        let v3 = try MembershipFixture.entry(group: founder, node: node, version: 3)
        #expect(!MembershipView(group: founder.nodeID, entries: [v1, v2removed]).isActiveMember(node))
        #expect(MembershipView(group: founder.nodeID, entries: [v3, v2removed, v1]).isActiveMember(node))
        let v3removed = try MembershipFixture.entry(group: founder, node: node, state: .removed, version: 3)
        #expect(!MembershipView(group: founder.nodeID, entries: [v3, v3removed]).isActiveMember(node))
        #expect(!MembershipView(group: founder.nodeID, entries: [v3removed, v3]).isActiveMember(node))
    }

    @Test func adminsThatOnlySignEachOtherNeverCount() throws {
        let founder = try MembershipFixture.identity()
        let x = try MembershipFixture.identity()
        let y = try MembershipFixture.identity()
        let view = MembershipView(group: founder.nodeID, entries: [
            try MembershipFixture.entry(group: founder, node: x.nodeID, admin: true, by: y),
            try MembershipFixture.entry(group: founder, node: y.nodeID, admin: true, by: x),
        ])
        #expect(view.selected.isEmpty)
        #expect(view.activeAdmins == [founder.nodeID])
    }

    @Test func theFounderCannotBeRemoved() throws {
        let founder = try MembershipFixture.identity()
        let view = MembershipView(group: founder.nodeID, entries: [
            try MembershipFixture.entry(group: founder, node: founder.nodeID, admin: true),
            try MembershipFixture.entry(group: founder, node: founder.nodeID, state: .removed, version: 2),
        ])
        #expect(view.isActiveMember(founder.nodeID))
    }
}

@Suite struct InvitationTests {
    @Test func codeRoundTripsThroughItsText() throws {
        let code = InvitationCode(
            inviter: String(repeating: "ab", count: 32), secret: Array(0..<16), addresses: ["10.0.0.1:4985", "[fe80::1]:4986"])
        #expect(code.text.hasPrefix("ferry1-"))
        #expect(try InvitationCode(parsing: " \(code.text)\n") == code)
    }

    @Test func malformedCodesAreRefusedWithClearErrors() throws {
        let good = InvitationCode(inviter: String(repeating: "ab", count: 32), secret: Array(0..<16), addresses: ["h:1"]).text
        func reason(_ text: String) -> String {
            do {
                _ = try InvitationCode(parsing: text)
                return "accepted"
            } catch { return error.description }
        }
        #expect(reason("ferry2-abc").contains("does not start with \"ferry1-\""))
        #expect(reason("ferry1-***").contains("not base64url"))
        #expect(reason(String(good.prefix(39))).contains("too short"))
        let noPort = InvitationCode(inviter: String(repeating: "ab", count: 32), secret: Array(0..<16), addresses: ["host"]).text
        #expect(reason(noPort).contains("not a host:port address"))
        var bytes = Base64URL.decode(String(good.dropFirst(7)))!
        bytes[0] = 9
        #expect(reason("ferry1-" + Base64URL.encode(bytes)).contains("unknown code format 9"))
    }

    @Test func expiredReusedAndWrongSecretsAreRefused() throws {
        let dir = MembershipFixture.tempDir()
        let clock = Locked(Date(timeIntervalSince1970: 1_000_000))
        let book = InvitationBook(file: dir + "/invitations.json", now: { clock.withLock { $0 } })
        #expect(!book.isOpen)
        let (secret, _) = try book.issue(admin: false, lifetime: 60)
        #expect(book.isOpen)
        #expect(throws: MembershipError.invitationUnknown) { try book.redeem(Array(repeating: 7, count: 16)) }
        let record = try book.redeem(secret)
        #expect(!record.admin)
        #expect(throws: MembershipError.invitationUsed) { try book.redeem(secret) }
        #expect(!book.isOpen)
        // Persisted: a restarted node still refuses the used code.
        let reloaded = InvitationBook(file: dir + "/invitations.json", now: { clock.withLock { $0 } })
        #expect(throws: MembershipError.invitationUsed) { try reloaded.redeem(secret) }
        let (late, _) = try book.issue(admin: true, lifetime: 60)
        clock.withLock { $0 = $0.addingTimeInterval(61) }
        #expect(!book.isOpen)
        #expect(throws: MembershipError.invitationExpired) { try book.redeem(late) }
    }

    @Test func repeatedFailuresAreRateLimitedForAMinute() {
        let clock = ManualClock()
        let attempts = JoinAttempts(limit: 3, window: .seconds(60), clock: clock)
        for _ in 0..<3 { attempts.failed(["peer", "10.0.0.9"]) }
        #expect(attempts.isLimited(["other", "10.0.0.9"]))
        clock.advance(by: .seconds(61))
        #expect(!attempts.isLimited(["peer", "10.0.0.9"]))
    }

    /// The wall clock set back a day after a code was issued: the code still ends when its
    /// lifetime of real time has passed (the boot clock), here and in a restarted node.
    @Test func anInvitationEndsAfterItsLifetimeEvenWhenTheClockIsSetBack() throws {
        let dir = MembershipFixture.tempDir()
        let wall = Locked(Date(timeIntervalSince1970: 1_000_000))
        let up = Locked(BootInstant(boot: "boot-1", seconds: 500))
        let open = { InvitationBook(file: dir + "/invitations.json", now: { wall.withLock { $0 } }, uptime: { up.withLock { $0 } }) }
        let book = open()
        let (secret, _) = try book.issue(admin: false, lifetime: 600)
        let (other, _) = try book.issue(admin: false, lifetime: 600)
        wall.withLock { $0 = $0.addingTimeInterval(-86_400) }
        up.withLock { $0.seconds += 599 }
        #expect(book.isOpen)
        up.withLock { $0.seconds += 2 }
        #expect(!book.isOpen, "a clock set back a day must not keep the code open")
        #expect(throws: MembershipError.invitationExpired) { try book.redeem(secret) }
        #expect(throws: MembershipError.invitationExpired) { try open().redeem(other) }
        // After a reboot only the wall clock can tell: the code lives to its wall expiry.
        up.withLock { $0 = BootInstant(boot: "boot-2", seconds: 30) }
        #expect(open().isOpen)
    }

    /// The wall clock set forward a day: the code has expired (refusing is the safe side).
    @Test func anInvitationEndsWhenTheClockIsSetForwardPastItsExpiry() throws {
        let wall = Locked(Date(timeIntervalSince1970: 1_000_000))
        let book = InvitationBook(file: nil, now: { wall.withLock { $0 } }, uptime: { BootInstant(boot: "b", seconds: 1) })
        let (secret, _) = try book.issue(admin: false, lifetime: 600)
        wall.withLock { $0 = $0.addingTimeInterval(86_400) }
        #expect(!book.isOpen)
        #expect(throws: MembershipError.invitationExpired) { try book.redeem(secret) }
    }
}

@Suite(.timeLimit(.minutes(2))) struct GroupMembershipTests {
    @Test func joinExchangeMakesTheNewNodeAMemberOnceAndBothTrustEachOther() throws {
        let a = try MembershipFixture.node("a")
        let b = try MembershipFixture.node("b")
        let invitation = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        #expect(a.membership.group == a.identity.nodeID)
        #expect(a.membership.invitations.isOpen)
        let request: JSON = ["secret": .string(Base64URL.encode(invitation.code.secret)), "database": "ferry", "addresses": ["127.0.0.1:5000"], "name": "b"]
        let reply = try a.membership.acceptJoin(request, peer: b.identity.nodeID)
        #expect(a.trust.isTrusted(b.identity.nodeID))
        #expect(a.trust.entry(b.identity.nodeID)?.source == .group)
        #expect(throws: MembershipError.invitationUsed) { try a.membership.acceptJoin(request, peer: b.identity.nodeID) }
        let message = Message(kind: .response, number: 1, body: reply.canonicalBytes)
        let joined = try b.membership.finishJoin(message, inviter: a.identity.nodeID, address: "127.0.0.1:4985", context: b.membership.context)
        #expect(joined.group == a.identity.nodeID)
        #expect(joined.members == 2)
        #expect(b.trust.isTrusted(a.identity.nodeID))
        #expect(b.membership.view?.isActiveMember(b.identity.nodeID) == true)
        // B is no admin: it may not invite.
        #expect(throws: MembershipError.notAdmin) { try b.membership.invite(admin: false, lifetime: 60, addresses: nil) }
        // A reloaded from its data directory still knows its group.
        let reopened = try MembershipLedger(dataDirectory: a.dataDirectory)
        #expect(reopened.group == a.identity.nodeID)
    }

    @Test func joiningIsRefusedInAnotherGroupAndWhenTheInviterIsUnreachable() async throws {
        let a = try MembershipFixture.node("a")
        let x = try MembershipFixture.node("x")
        let fresh = try MembershipFixture.node("fresh")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let other = try x.membership.invite(admin: false, lifetime: 60, addresses: ["127.0.0.1:1"])
        await #expect(throws: MembershipError.alreadyInGroup(a.identity.nodeID)) {
            _ = try await a.membership.join(code: other.code.text, name: nil)
        }
        do {
            _ = try await fresh.membership.join(code: other.code.text, name: nil)
            Issue.record("a join with an unreachable inviter succeeded")
        } catch let e as MembershipError {
            #expect(e.code == "inviter_unreachable" && e.isTransient, "\(e)")
            #expect(e.description.contains("127.0.0.1:1"))
        }
        #expect(fresh.membership.group == nil)
        await #expect(throws: MembershipError.self) { _ = try await fresh.membership.join(code: "ferry1-", name: nil) }
    }

    @Test func storeRejectsReplicatedEntriesThatAreForgedForeignOrDeleted() throws {
        let a = try MembershipFixture.node("a")
        let stranger = try MembershipFixture.identity()
        let newcomer = String(repeating: "9", count: 64)
        func insert(_ entry: MemberEntry, deleted: Bool = false) throws -> InsertOutcome {
            let id = MemberEntry.documentID(entry.node)
            let body = deleted ? JSON.object([:]) : entry.body
            let rev = RevisionID.compute(parent: nil, deleted: deleted, canonicalBody: body.canonicalBytes)
            return try a.store.insertRevisions([IncomingRevision(id: id, revision: rev, history: [], deleted: deleted, body: body)])[0]
        }
        // In no group yet: every entry is refused.
        let early = try MembershipFixture.entry(group: stranger, node: newcomer)
        guard case .rejected = try insert(early) else { Issue.record("an entry was stored by a node in no group"); return }
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let aIdentity = a.identity
        // Signed by a stranger claiming the group: refused.
        let forged = try MemberEntry.signed(
            group: aIdentity.nodeID, node: newcomer, name: nil, state: .member, admin: true, version: 1, addresses: [], by: stranger)
        guard case .rejected(let why) = try insert(forged) else { Issue.record("a forged entry was stored"); return }
        #expect(why.description.contains("neither the founder nor an active admin"))
        // Another group's entry: refused.
        guard case .rejected = try insert(try MembershipFixture.entry(group: stranger, node: newcomer)) else {
            Issue.record("a foreign entry was stored"); return
        }
        // A tombstone: refused.
        let valid = try MembershipFixture.entry(group: aIdentity, node: newcomer)
        guard case .rejected = try insert(valid, deleted: true) else { Issue.record("a deletion was stored"); return }
        // A valid entry goes in, and the node trusts the newcomer once it re-reads.
        guard case .inserted = try insert(valid) else { Issue.record("a valid entry was refused"); return }
        try a.membership.loadFromStore()
        #expect(a.trust.isTrusted(newcomer))
        #expect(try a.store.document(MemberEntry.documentID(stranger.nodeID)) == nil)
    }

    @Test func addressRecordsAreTakenOnlyFromTheMemberThemselvesAndMoveItsDialURL() throws {
        let a = try MembershipFixture.node("a")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let group = a.identity.nodeID
        let member = try MembershipFixture.identity()
        let stranger = try MembershipFixture.identity()
        func insert(_ body: JSON, node: String, deleted: Bool = false) throws -> InsertOutcome {
            let id = MemberAddresses.documentID(node)
            let rev = RevisionID.compute(parent: nil, deleted: deleted, canonicalBody: body.canonicalBytes)
            return try a.store.insertRevisions([IncomingRevision(id: id, revision: rev, history: [], deleted: deleted, body: body)])[0]
        }
        let record = try MemberAddresses.signed(group: group, addresses: ["127.0.0.1:6001"], version: 5, by: member)
        // Not a member yet: refused.
        guard case .rejected(let notMember) = try insert(record.body, node: member.nodeID) else { Issue.record("a non-member's record was stored"); return }
        #expect(notMember.description.contains("not a member"))
        // A member now, with an entry saying it listens at 127.0.0.1:5000.
        let entry = try MemberEntry.signed(
            group: group, node: member.nodeID, name: nil, state: .member, admin: false, version: 1, addresses: ["127.0.0.1:5000"],
            by: a.identity)
        try a.membership.write(entry)
        #expect(a.trust.isTrusted(member.nodeID))
        // Someone else signing for it: refused, however valid the rest.
        var forged = try MemberAddresses.signed(group: group, addresses: ["10.9.9.9:1"], version: 9, by: stranger)
        forged.node = member.nodeID
        guard case .rejected(let why) = try insert(forged.body, node: member.nodeID) else { Issue.record("a forged record was stored"); return }
        #expect(why.description.contains("only a node may say where it listens") || why.description.contains("signature"))
        // Another group's record, and a tombstone: refused.
        let foreign = try MemberAddresses.signed(group: stranger.nodeID, addresses: ["127.0.0.1:6001"], version: 5, by: member)
        guard case .rejected = try insert(foreign.body, node: member.nodeID) else { Issue.record("a foreign record was stored"); return }
        guard case .rejected = try insert(.object([:]), node: member.nodeID, deleted: true) else { Issue.record("a deletion was stored"); return }
        // Its own record goes in and moves where the group dials it.
        guard case .inserted = try insert(record.body, node: member.nodeID) else { Issue.record("a member's own record was refused"); return }
        try a.membership.loadFromStore()
        let urls = GroupMembership.memberURLs(
            try #require(a.membership.view), context: a.membership.context, overrides: [:],
            records: a.membership.state.withLock { $0.addressRecords })
        #expect(urls[member.nodeID] == "wss://127.0.0.1:6001/ferry/sync")
        // It grants nothing: the member is no admin for having a record.
        #expect(a.membership.view?.isAdmin(member.nodeID) == false)
    }

    @Test func aReplayedMemberEntryIsRefusedAndTheRemovalStillCountsAfterARestart() throws {
        let a = try MembershipFixture.node("a")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let member = try MembershipFixture.identity()
        let id = MemberEntry.documentID(member.nodeID)
        let joined = try MembershipFixture.entry(group: a.identity, node: member.nodeID, version: 1)
        try a.membership.write(joined)
        _ = try a.membership.remove(member.nodeID)
        #expect(!a.trust.isTrusted(member.nodeID))
        // Its old entry pushed back as a child of the removal, as a conflict branch, or a tombstone: refused.
        #expect(Replay.rejected(try Replay.push(joined.body, to: id, in: a.store))?.contains("superseded") == true)
        #expect(Replay.rejected(try Replay.push(joined.body, to: id, in: a.store, as: .branch))?.contains("superseded") == true)
        #expect(Replay.rejected(try Replay.push(joined.body, to: id, in: a.store, deleted: true))?.contains("never deleted") == true)
        try a.membership.loadFromStore()
        #expect(a.membership.view?.isActiveMember(member.nodeID) == false)
        // A tree where the old entry slipped in on top and the removal's body was pruned.
        let removal = try #require(try a.store.document(id)).body
        let founder = try #require(try a.store.document(MemberEntry.documentID(a.identity.nodeID))).body
        let tree = try Replay.bareStore()
        _ = try Replay.push(founder, to: MemberEntry.documentID(a.identity.nodeID), in: tree)
        for body in [joined.body, removal, joined.body, joined.body, joined.body] { _ = try Replay.push(body, to: id, in: tree) }
        // Read alone, that tree makes the removed node a member again; what the node remembers does not.
        let forgetful = try MembershipLedger(dataDirectory: try Replay.forgetfulDirectory(group: a.identity.nodeID))
        try Replay.loadMembers(tree, into: forgetful)
        #expect(forgetful.state.withLock { s in MembershipView(group: a.identity.nodeID, entries: s.ledger.values.joined()).isActiveMember(member.nodeID) })
        let restarted = try MembershipLedger(dataDirectory: a.dataDirectory)
        try Replay.loadMembers(tree, into: restarted)
        #expect(restarted.removedMembers().contains(member.nodeID))
    }

    @Test func aReplayedAddressRecordIsRefusedAndTheNewestStillCountsAfterARestart() throws {
        let a = try MembershipFixture.node("a")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let member = try MembershipFixture.identity()
        try a.membership.write(try MembershipFixture.entry(group: a.identity, node: member.nodeID, version: 1))
        let id = MemberAddresses.documentID(member.nodeID)
        let old = try MemberAddresses.signed(group: a.identity.nodeID, addresses: ["127.0.0.1:6001"], version: 5, by: member)
        let new = try MemberAddresses.signed(group: a.identity.nodeID, addresses: ["127.0.0.1:6002"], version: 6, by: member)
        #expect(Replay.rejected(try Replay.push(old.body, to: id, in: a.store)) == nil)
        #expect(Replay.rejected(try Replay.push(new.body, to: id, in: a.store)) == nil)
        #expect(Replay.rejected(try Replay.push(old.body, to: id, in: a.store))?.contains("superseded") == true)
        #expect(Replay.rejected(try Replay.push(old.body, to: id, in: a.store, as: .branch))?.contains("superseded") == true)
        #expect(Replay.rejected(try Replay.push(old.body, to: id, in: a.store, deleted: true))?.contains("never deleted") == true)
        try a.membership.loadFromStore()
        #expect(a.membership.state.withLock { $0.addressRecords[member.nodeID] } == new)
        let tree = try Replay.bareStore()
        for body in [old.body, new.body, old.body, old.body, old.body] { _ = try Replay.push(body, to: id, in: tree) }
        let restarted = try MembershipLedger(dataDirectory: a.dataDirectory)
        try Replay.loadMembers(tree, into: restarted)
        #expect(restarted.state.withLock { $0.addressRecords[member.nodeID] } == new)
    }

    @Test func removalDropsTheMemberFromTrustButKeepsManualTrust() throws {
        let a = try MembershipFixture.node("a")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let b = String(repeating: "b", count: 64)
        let c = String(repeating: "c", count: 64)
        try a.membership.write(try MembershipFixture.entry(group: a.identity, node: b))
        try a.membership.write(try MembershipFixture.entry(group: a.identity, node: c))
        try a.trust.add(.init(nodeID: c, name: nil, policy: .trusted, source: .api))
        #expect(a.trust.ids.contains(b) && a.trust.ids.contains(c))
        let removed = try a.membership.remove(String(b.prefix(10)))
        #expect(removed.state == .removed && removed.version == 2)
        _ = try a.membership.remove(c)
        #expect(!a.trust.isTrusted(b))
        #expect(!a.trust.ids.contains(b))
        #expect(a.trust.isTrusted(c), "manual trust outlives a group removal")
        #expect(throws: MembershipError.cannotRemoveFounder) { try a.membership.remove(a.identity.nodeID) }
        #expect(throws: MembershipError.self) { try a.membership.remove("nobody") }
    }

    @Test func pulledEntriesAreValidatedAndARestrictedPeerStillRelaysValidOnes() async throws {
        let a = try MembershipFixture.node("a")
        _ = try a.membership.invite(admin: false, lifetime: 60, addresses: nil)
        let stranger = try MembershipFixture.identity()
        // A peer whose database holds a valid entry (signed by A), a forged one and a note;
        // A trusts it for notes only.
        let remote = try DocumentStore.inMemory()
        let valid = try MembershipFixture.entry(group: a.identity, node: String(repeating: "1", count: 64))
        let forged = try MemberEntry.signed(
            group: a.identity.nodeID, node: String(repeating: "2", count: 64), name: nil, state: .member, admin: true, version: 1,
            addresses: [], by: stranger)
        try remote.put(MemberEntry.documentID(valid.node), body: valid.body)
        try remote.put(MemberEntry.documentID(forged.node), body: forged.body)
        try remote.put(try DocumentID("notes/1"), body: ["text": "hi"])
        try remote.put(try DocumentID("other"), body: [:])
        try a.trust.add(.init(nodeID: stranger.nodeID, name: nil, policy: PeerPolicy(write: .init(idPrefixes: ["notes/"])), source: .api))
        // No heartbeats: this is about validation, and a wall-time watchdog starved under load
        // closed the link before the pull (the one attempt then failed).
        var options = ReplicationResponder.Options()
        options.liveness.enabled = false
        let responder = ReplicationResponder(store: remote, options: options, logger: .init(label: "t"))
        let replicator = a.replicators.replicator(peerID: stranger.nodeID, connector: {
            let (client, server) = InMemoryEndpoint.pair()
            Task { await responder.serve(server) }
            return client
        }) { rc in
            rc.direction = .pull
            rc.maxAttempts = 1
        }
        await replicator.run()
        #expect(try a.store.document(try DocumentID("notes/1")) != nil)
        #expect(try a.store.document(try DocumentID("other")) == nil, "the policy still binds other documents")
        #expect(try a.store.document(MemberEntry.documentID(valid.node)) != nil, "a valid entry passes a restricted policy")
        #expect(try a.store.document(MemberEntry.documentID(forged.node)) == nil, "a forged entry is never stored")
        #expect(replicator.summary.rejected == 2)
    }

    @Test func restrictedPeerPoliciesStillCarryMembershipEntries() throws {
        let readOnly = PeerPolicy(read: .init(idPrefixes: ["notes/"]), write: .none, mayDelete: false)
        let widened = ReplicationFactory.carryingMembership(readOnly)
        let id = MemberEntry.documentID(String(repeating: "a", count: 64))
        #expect(widened.write.admits(id: id, body: nil))
        #expect(widened.read.admits(id: id, body: nil))
        #expect(!widened.write.admits(id: try DocumentID("notes/x"), body: nil))
        #expect(ReplicationFactory.carryingMembership(PeerPolicy.trusted) == .trusted)
        #expect(ReplicationFactory.denyAll.write.admits(id: id, body: nil) == false)
    }
}

import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

// The join exchange on the listener's join path: the inviter's side and the new member's.
extension GroupMembership {
    /// What a completed join tells the caller.
    public struct Joined: Sendable {
        public let group: String
        public let inviter: String
        public let members: Int
    }

    // MARK: the join exchange, inviter side

    static let joinProfile = "join"
    static let joinTimeout: Duration = .seconds(15)

    /// The next message on `endpoint`, or nil when it ends or `joinTimeout` passes first.
    func firstMessage(from endpoint: any MessageEndpoint) async throws -> [UInt8]? {
        let clock = self.clock
        return try await Race.first(
            { () async throws -> [UInt8]? in
                var it = endpoint.incoming.makeAsyncIterator()
                return try await it.next()
            },
            { () async throws -> [UInt8]? in
                try await clock.sleep(for: Self.joinTimeout)
                return nil
            })
    }

    /// Serves one join connection: reads the `join` request, checks the invitation, signs
    /// the new member's entry and answers with the group and its valid entries.
    func serveJoin(_ endpoint: any MessageEndpoint, peer: String, remote: String?) async {
        let keys = [peer, remote ?? "?"]
        let number: UInt64
        let request: JSON
        do {
            let first = try await firstMessage(from: endpoint)
            guard let bytes = first else { return }
            let message = try Message(decoding: bytes)
            guard message.kind == .request, message.profile == Self.joinProfile else {
                try? await endpoint.send(
                    Message.errorReply(to: message.number, SyncError(.badRequest, message: "this path only takes a join request", isTransient: false))
                        .encoded())
                return
            }
            number = message.number
            request = try message.json()
        } catch {
            logger.info("join connection failed", metadata: ["peer": "\(peer)", "error": "\(LogText.escape(describing: error))"])
            return
        }
        let reply: Message
        do {
            if attempts.isLimited(keys) { throw MembershipError.rateLimited }
            let body = try acceptJoin(request, peer: peer)
            reply = Message(kind: .response, number: number, properties: [("Profile", Self.joinProfile)], body: body.canonicalBytes)
            logger.notice("a node joined the group", metadata: ["node": "\(peer)", "remote": "\(remote ?? "?")"])
        } catch {
            let e = error as? MembershipError ?? .storage("\(error)")
            switch e {
            case .invitationUnknown, .invitationUsed, .invitationExpired, .badInvitationCode: attempts.failed(keys)
            default: break
            }
            let level: Logger.Level = refusals.isNews("\(peer) \(e.code)") ? .warning : .debug
            logger.log(level: level, "refused a join", metadata: ["peer": "\(peer)", "remote": "\(remote ?? "?")", "reason": "\(e.code)"])
            reply = Message.errorReply(to: number, SyncError.from(e))
        }
        try? await endpoint.send(reply.encoded())
    }

    /// Checks a join request and admits the peer; returns the reply body.
    func acceptJoin(_ request: JSON, peer: String) throws -> JSON {
        let c = context
        guard let secretText = request["secret"]?.stringValue, let secret = Base64URL.decode(secretText), secret.count == 16 else {
            throw MembershipError.badInvitationCode("the request carries no 16-byte secret")
        }
        guard let view = self.view, let group = self.group, view.isAdmin(c.identity.nodeID) else { throw MembershipError.notAdmin }
        if let database = request["database"]?.stringValue, database != c.databaseName {
            throw MembershipError.wrongGroup(
                "the joining node replicates database \"\(LogText.escape(database))\", this group \"\(c.databaseName)\" (use the same --group)")
        }
        var addresses: [String] = []
        if case .array(let list)? = request["addresses"] {
            addresses = list.compactMap(\.stringValue).filter { InvitationCode.split(address: $0) != nil }.prefix(16).map { $0 }
        }
        var name = request["name"]?.stringValue
        if let n = name, (try? NodeName.validate(n)) == nil || n.count > 64 { name = nil }
        let invitation = try invitations.redeem(secret)
        let entry = try MemberEntry.signed(
            group: group, node: peer, name: name, state: .member, admin: invitation.admin, version: nextVersion(peer),
            addresses: addresses, by: c.identity)
        try write(entry)
        return .object([
            "group": .string(group), "database": .string(c.databaseName), "revisions": .array(try validRevisions()),
        ])
    }

    /// Every leaf revision of a member document whose entry counts, with its history: what a
    /// new member stores before it first replicates.
    func validRevisions() throws -> [JSON] {
        let c = context
        guard let view = self.view else { return [] }
        var out: [JSON] = []
        for node in view.selected.keys.sorted() {
            let id = MemberEntry.documentID(node)
            guard let tree = try c.store.revisionTree(id) else { continue }
            for leaf in tree.leaves where !leaf.deleted {
                guard let doc = try? c.store.document(id, revision: leaf.id), let e = try? MemberEntry(parsing: doc.body), view.counts(e)
                else { continue }
                out.append([
                    "id": .string(id.rawValue), "rev": .string(leaf.id.description),
                    "history": .array(tree.history(of: leaf.id).dropFirst().map { .string($0.description) }), "body": doc.body,
                ])
            }
        }
        return out
    }

    // MARK: the join exchange, new member side

    /// Joins the group of the code's inviter: dials it (pinned to the inviter's ID), sends
    /// the secret, checks the reply, then stores the group and its entries.
    public func join(code text: String, name: String?) async throws -> Joined {
        let code = try InvitationCode(parsing: text)
        let c = context
        let me = c.identity.nodeID
        if code.inviter == me { throw MembershipError.badInvitationCode("this node issued it; run `ferry join` on the new node") }
        if let group = self.group, !(view?.isActiveMember(code.inviter) ?? false) { throw MembershipError.alreadyInGroup(group) }
        let request: JSON = [
            "secret": .string(Base64URL.encode(code.secret)), "database": .string(c.databaseName),
            "addresses": .array(c.listenAddresses().map(JSON.string)), "name": name.map(JSON.string) ?? .null,
        ]
        var failures: [String] = []
        for address in code.addresses {
            let reply: Message
            do {
                reply = try await exchange(request, at: address, inviter: code.inviter, identity: c.identity)
            } catch let e as MembershipError {
                throw e
            } catch {
                failures.append("\(address): \(error)")
                continue
            }
            if reply.kind == .error {
                let carried = reply.carriedError
                throw Self.joinError(code: carried.code, message: carried.message)
            }
            return try finishJoin(reply, inviter: code.inviter, address: address, context: c)
        }
        throw MembershipError.inviterUnreachable(failures.joined(separator: "; "))
    }

    /// One join request and its reply over a fresh pinned connection.
    func exchange(_ request: JSON, at address: String, inviter: String, identity: NodeIdentity) async throws -> Message {
        var connector = try WebSocketConnector(url: "wss://\(address)\(WebSocketListener.joinPath)", serverTrust: .pinned([inviter]), identity: identity)
        connector.logger = logger
        connector.pingInterval = nil
        connector.connectTimeout = .seconds(5)
        let endpoint: any MessageEndpoint
        do { endpoint = try await connector.connect() } catch let e as TransportError {
            switch e.kind {
            case .notTrustedByPeer:
                throw MembershipError.noOpenInvitation
            case .untrustedPeer:
                throw MembershipError.inviterUnreachable("\(address) is not the inviter (its certificate is not the code's node ID)")
            default:
                throw e
            }
        }
        do {
            try await endpoint.send(Message(kind: .request, number: 1, properties: [("Profile", Self.joinProfile)], body: request.canonicalBytes).encoded())
            let answer = try await firstMessage(from: endpoint)
            await endpoint.close(error: nil)
            guard let answer else { throw MembershipError.inviterUnreachable("\(address) did not answer the join request") }
            return try Message(decoding: answer)
        } catch {
            await endpoint.close(error: nil)
            throw error
        }
    }

    /// The membership error an inviter's error reply names (its code on the wire).
    static func joinError(code: String, message: String) -> MembershipError {
        let named: [MembershipError] = [.invitationExpired, .invitationUsed, .invitationUnknown, .rateLimited, .notAdmin, .wrongGroup(message)]
        switch named.first(where: { $0.code == code }) {
        case .notAdmin?: return .badReply("the inviter is no longer an admin of its group")
        case let error?: return error
        case nil: return .badReply("\(code): \(message)")
        }
    }

    /// Checks the inviter's reply, stores group.json and the entries, and applies them.
    func finishJoin(_ reply: Message, inviter: String, address: String, context c: Context) throws -> Joined {
        let me = c.identity.nodeID
        let body = try reply.json()
        guard let group = body["group"]?.stringValue.flatMap(NodeIDFormat.normalized) else { throw MembershipError.badReply("no group ID") }
        guard body["database"]?.stringValue == c.databaseName else {
            throw MembershipError.wrongGroup("the inviter replicates database \"\(LogText.escape(body["database"]?.stringValue ?? "?"))\", this node \"\(c.databaseName)\"")
        }
        if let mine = self.group, mine != group { throw MembershipError.alreadyInGroup(mine) }
        var revisions: [(IncomingRevision, MemberEntry)] = []
        for item in body["revisions"]?.arrayItems ?? [] {
            guard let idText = item["id"]?.stringValue, let id = try? DocumentID(idText, allowReserved: true),
                let rev = item["rev"]?.stringValue.flatMap({ try? RevisionID($0) }), let entryBody = item["body"],
                let entry = try? MemberEntry(parsing: entryBody), MemberEntry.node(inDocument: id) == entry.node
            else { throw MembershipError.badReply("a revision is malformed") }
            let history = (item["history"]?.arrayItems ?? []).compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
            revisions.append((IncomingRevision(id: id, revision: rev, history: history, deleted: false, body: entryBody), entry))
        }
        let view = MembershipView(group: group, entries: revisions.map(\.1))
        guard view.isAdmin(inviter) else { throw MembershipError.badReply("the entries do not make the inviter an admin of group \(group.prefix(12))") }
        guard view.isActiveMember(me) else { throw MembershipError.badReply("the entries do not make this node a member") }
        try saveGroupFile(group, inviter: inviter)
        let scheme = c.insecure ? "ws" : "wss"
        state.withLock { s in
            s.group = group
            s.urlOverrides[inviter] = "\(scheme)://\(address)/\(c.databaseName)/sync"
        }
        // Signers first: the store's validator admits an entry only once its signer is an admin.
        var pending = revisions.map(\.0)
        while !pending.isEmpty {
            let outcomes = try c.store.insertRevisions(pending)
            let rejected = zip(pending, outcomes).filter { if case .rejected = $0.1 { return true } else { return false } }.map(\.0)
            if rejected.count == pending.count { break }
            pending = rejected
        }
        try loadFromStore()
        logger.notice("joined a group", metadata: ["group": "\(group)", "inviter": "\(inviter)", "members": "\(view.activeMembers.count)"])
        return Joined(group: group, inviter: inviter, members: view.activeMembers.count)
    }
}

extension JSON {
    /// The elements of an array; empty for anything else.
    var arrayItems: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }
}

import Crypto
import FerryCore
import FerryCouch
import FerryCouchClient
import FerryQuery
import FerryStore
import FerrySync
import Foundation
import Logging

/// The options only a replication with a CouchDB-protocol database has: where its
/// credentials come from, how its certificate is trusted, whether to create the target,
/// a Mango selector, and what the remote may write here and read from here.
public struct CouchReplicationOptions: Sendable, Equatable {
    /// A file holding `USER:PASSWORD` (first line), read each time the replication starts.
    public var credentialsFile: String?
    /// An environment variable holding `USER:PASSWORD`, read each time the replication starts.
    public var credentialsEnv: String?
    /// The SHA-256 of the server certificate's DER, 64 lowercase hex (https only); nil:
    /// the system trust store.
    public var pin: String?
    /// Create the remote database when it is missing (pushing only). Default false.
    public var createTarget = false
    /// A Mango selector: only matching revisions move, either way. nil: all.
    public var selector: JSON?
    /// What the remote may write here and read from here; nil: everything.
    public var policy: PeerPolicy?
    public init() {}

    /// The config file's keys for these options.
    var json: [String: JSON] {
        var o: [String: JSON] = [:]
        if let credentialsFile { o["credentialsFile"] = .string(credentialsFile) }
        if let credentialsEnv { o["credentialsEnv"] = .string(credentialsEnv) }
        if let pin { o["pin"] = .string(pin) }
        if createTarget { o["createTarget"] = true }
        if let selector { o["selector"] = selector }
        if let policy { o["policy"] = policy.json }
        return o
    }

    /// The keys of a replication entry that only a CouchDB replication takes.
    static let keys: Set<String> = ["credentialsFile", "credentialsEnv", "pin", "createTarget", "selector", "policy"]

    /// Why these options cannot work with `url` in `direction` (key and reason), or nil.
    /// Nothing is read from the file or environment here: that happens at each start.
    public func problem(url: String, direction: ReplicatorConfiguration.Direction) -> (key: String, reason: String)? {
        let endpoint: CouchEndpoint
        do { endpoint = try CouchEndpoint.parse(url) } catch { return ("url", error.message) }
        if credentialsFile != nil && credentialsEnv != nil {
            return ("credentialsEnv", "give credentialsFile or credentialsEnv, not both")
        }
        if endpoint.credentials != nil, credentialsFile != nil || credentialsEnv != nil {
            let key = credentialsFile != nil ? "credentialsFile" : "credentialsEnv"
            return (key, "the URL already holds credentials: take them out of the URL, or drop \(key)")
        }
        if let f = credentialsFile, f.isEmpty { return ("credentialsFile", "must be a file path") }
        if let e = credentialsEnv, e.isEmpty || e.contains("=") { return ("credentialsEnv", "must be an environment variable name") }
        if let pin {
            guard endpoint.scheme == "https" else { return ("pin", "a certificate pin needs an https:// URL") }
            guard Self.isPin(pin) else {
                return ("pin", "must be 64 hex digits: the SHA-256 of the server certificate's DER")
            }
        }
        if createTarget && direction == .pull {
            return ("createTarget", "only a push creates the remote database; drop it for a pull")
        }
        if let selector {
            do { _ = try MangoSelector(parsing: selector) } catch { return ("selector", "not a valid Mango selector: \(error.description)") }
        }
        return nil
    }

    /// A start-up failure as the replicator status shows it (its message not prefixed twice).
    static func syncError(_ error: any Error) -> SyncError {
        if let e = error as? CouchClientError {
            return SyncError(domain: e.domain, .init(name: e.code), message: e.message, isTransient: e.isTransient, cause: e)
        }
        return SyncError.from(error)
    }

    /// Whether `text` is 64 hex digits (either case; an SHA-256 fingerprint).
    static func isPin(_ text: String) -> Bool {
        text.utf8.count == 64 && text.allSatisfy(\.isHexDigit)
    }

    /// The endpoint to replicate with: the URL, then the credentials from the file or the
    /// environment (read now, so a fixed file works on the next start), the pin and
    /// createTarget. A missing file or variable is a permanent `CouchClientError`.
    public func endpoint(url: String) throws(CouchClientError) -> CouchEndpoint {
        var endpoint = try CouchEndpoint.parse(url)
        if let credentialsFile { endpoint.credentials = try CouchCredentials.fromFile(credentialsFile) }
        if let credentialsEnv { endpoint.credentials = try CouchCredentials.fromEnvironment(credentialsEnv) }
        if let pin { endpoint.trust = .pinned(pin.lowercased()) }
        endpoint.createTarget = createTarget
        return endpoint
    }
}

/// A Mango selector as a replication filter: a revision passes when its document, seen as
/// CouchDB sees it (`_id`, `_rev`, `_deleted`, `_attachments` stubs and the fields), matches.
public enum SelectorFilter {
    /// The filter for `selector`; its name holds a hash of the canonical selector, so that a
    /// replication whose selector changes starts from a new checkpoint.
    public static func filter(_ selector: JSON) throws(MangoError) -> RevisionFilter {
        let parsed = try MangoSelector(parsing: selector)
        let digest = Hex.encode(SHA256.hash(data: selector.canonicalBytes)).prefix(16)
        return RevisionFilter(name: "selector-\(digest)") { input in parsed.matches(couchView(input)) }
    }

    /// The document's CouchDB form as far as a selector can see it.
    static func couchView(_ input: FilterInput) -> JSON {
        var o = input.body.objectValue ?? [:]
        if let stored = o.removeValue(forKey: "@attachments")?.objectValue {
            var stubs: [String: JSON] = [:]
            for (name, a) in stored {
                var stub: [String: JSON] = ["stub": true]
                if let t = a["contentType"] { stub["content_type"] = t }
                if let l = a["length"] { stub["length"] = l }
                if let d = a["md5"] { stub["digest"] = d }
                if let r = a["revpos"] { stub["revpos"] = r }
                stubs[name] = .object(stub)
            }
            o["_attachments"] = .object(stubs)
        }
        o["_id"] = .string(input.id.rawValue)
        o["_rev"] = .string(input.revision.description)
        if input.deleted { o["_deleted"] = true }
        return .object(o)
    }

    /// `a` and then `b`: both must admit (a nil side admits all); named after both.
    static func both(_ a: RevisionFilter?, _ b: RevisionFilter?) -> RevisionFilter? {
        guard let a else { return b }
        guard let b else { return a }
        return RevisionFilter(name: "\(a.name)+\(b.name)") { a.admits($0) && b.admits($0) }
    }
}

extension ReplicationFactory {
    /// The longest wait between attempts of a CouchDB replication whose server is away: a
    /// hub is not on the LAN, and a dial there costs more than one to a peer, so longer
    /// than a peer's 1.5 s, but short enough that the hub's return is noticed within a minute.
    public static let maxCouchRetryWait: Duration = .seconds(60)

    /// A replicator with the CouchDB-protocol database `couch` reaches, built as peer links
    /// are (resolvers, the node's pull filter, metrics) but without what only
    /// Ferry peers offer (mesh relays, heartbeats, the catch-up lease): `policy` bounds what
    /// the remote may write here and read from here (nil: everything), and `selector`
    /// narrows both directions (and is sent to the server as `filter=_selector`).
    /// `configure` sets the rest (direction, continuous, document IDs, checkpoint reset).
    public func couchReplicator(
        _ couch: CouchReplication, policy: PeerPolicy?, selector: JSON?, logger: Logger? = nil,
        configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    ) throws(MangoError) -> Replicator {
        let selectorFilter = try selector.map { s throws(MangoError) in try SelectorFilter.filter(s) }
        return couch.replicator(
            store: store, configuration: couchConfiguration(policy: policy, selector: selector, selectorFilter: selectorFilter, configure: configure),
            clock: clock, logger: logger ?? self.logger)
    }

    /// The configuration `couchReplicator` runs with.
    func couchConfiguration(
        policy: PeerPolicy?, selector: JSON?, selectorFilter: RevisionFilter?, configure: (inout ReplicatorConfiguration) -> Void
    ) -> ReplicatorConfiguration {
        var rc = ReplicatorConfiguration()
        rc.wiring.nodeID = nodeID
        // `readOnly` refuses pushes from peers; a replication this node runs itself pulls.
        rc.remotePolicy = policy ?? .trusted
        rc.resolvers = resolvers
        rc.pullFilter = SelectorFilter.both(pullFilter, selectorFilter)
        rc.pushFilter = selectorFilter
        rc.remoteSelector = selector
        rc.wiring.metrics = metrics
        rc.maxAttemptWait = Self.maxCouchRetryWait
        // Documents move in HTTP requests, not inline in a changes feed.
        rc.inlineLimit = 0
        configure(&rc)
        return rc
    }
}

extension PeerManager {
    /// The link of a CouchDB replication: each start reads the credentials, makes the HTTP
    /// client and a replicator (a start that cannot, such as for a missing credentials file,
    /// shows why in the status and is tried again at the link's next restart), and closes
    /// the client once that replicator has stopped.
    func makeCouchLink(_ spec: ReplicationSpec, resetCheckpoint: Bool = false) -> ReplicationLink {
        let replicators = self.replicators, logger = self.logger.with("replication", spec.id).with("url", spec.displayURL)
        // A reset applies to the first run only, not to every restart after an error.
        let reset = Locked(resetCheckpoint)
        let make: @Sendable () -> ReplicationLink.Run = {
            let once = reset.withLock { r in
                defer { r = false }
                return r
            }
            return Self.couchRun(spec, replicators: replicators, logger: logger, resetCheckpoint: once)
        }
        return ReplicationLink(url: spec.displayURL, peerID: "", policy: spec.couch?.policy, make: make, clock: clock, logger: logger)
    }

    static func couchRun(_ spec: ReplicationSpec, replicators: ReplicationFactory, logger: Logger, resetCheckpoint: Bool = false)
        -> ReplicationLink.Run
    {
        let options = spec.couch ?? CouchReplicationOptions()
        let configure: (inout ReplicatorConfiguration) -> Void = { rc in
            rc.resetCheckpoint = resetCheckpoint
            rc.direction = spec.direction
            rc.continuous = spec.continuous
            rc.documentIDs = spec.documentIDs.map { Set($0.compactMap { try? DocumentID($0) }) }
        }
        do {
            let couch = CouchReplication(endpoint: try options.endpoint(url: spec.url), logger: logger)
            let replicator = try replicators.couchReplicator(couch, policy: options.policy, selector: options.selector, logger: logger, configure: configure)
            return .init(replicator: replicator, finished: { await couch.shutdown() })
        } catch {
            // Checked when the spec was read; here only what changed since (a file, a variable).
            let failure = CouchReplicationOptions.syncError(error)
            logger.error("the replication cannot start", metadata: ["error": "\(LogText.escape(describing: failure))"])
            let config = replicators.couchConfiguration(policy: options.policy, selector: nil, selectorFilter: nil, configure: configure)
            let replicator = Replicator(
                store: replicators.store, remote: { throw failure }, configuration: config, clock: replicators.clock, logger: logger)
            return .init(replicator: replicator, finished: nil)
        }
    }
}

extension SyncError {
    /// `domain/code: message` with the prefix once: an error converted from another
    /// domain's (such as a `CouchClientError`) carries it in its message already.
    public var statusText: String {
        message.hasPrefix("\(domain)/\(code): ") ? message : description
    }
}

import FerryCouchClient
import FerryTransport
import Foundation

/// The other side of an app's replication: a Ferry peer, a CouchDB-protocol database, or
/// any message endpoint.
public enum ReplicationTarget: Sendable {
    /// A Ferry node's listener, `wss://HOST:PORT/ferry/sync`, accepted only with the
    /// certificate whose SHA-256 is `pin` (the node's ID, `ferry id` there). This side
    /// presents `identity`, which the node must trust (`ferry trust add` its `nodeID`).
    case peer(url: String, pin: String, identity: NodeIdentity)
    /// A CouchDB-protocol database, `http(s)://HOST:PORT/DATABASE` (a Ferry node's CouchDB
    /// API, Apache CouchDB, PouchDB's server), logged in as `credentials`. With `pin`, an
    /// https server is accepted only with the certificate whose SHA-256 it is; without, by
    /// the system's CA certificates.
    case couchDB(url: String, credentials: CouchCredentials? = nil, pin: String? = nil)
    /// Any message pipe: `open` is called for each attempt (a Unix socket, stdio, a test's
    /// `InMemoryEndpoint.pair()`); the other end runs `ReplicationResponder.serve`.
    case endpoint(open: @Sendable () async throws -> any MessageEndpoint)
}

/// A CouchDB-protocol server's user and password (never logged or printed).
public typealias CouchCredentials = FerryCouchClient.CouchCredentials

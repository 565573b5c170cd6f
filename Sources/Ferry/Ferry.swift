// The one module an app imports to embed Ferry: a document store and replications with a
// Ferry peer over pinned TLS, a CouchDB-protocol database, or any message endpoint.
// The modules whose types its API uses are re-exported, so `import Ferry` is enough.
@_exported import FerryCore
@_exported import FerryStore
@_exported import FerrySync
@_exported import FerryTransport

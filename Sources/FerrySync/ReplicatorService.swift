import ServiceLifecycle

/// A replicator is a swift-service-lifecycle service: in a ServiceGroup, graceful shutdown
/// (SIGTERM/SIGINT) stops it after the batch in progress, with its checkpoint saved.
extension Replicator: Service {}

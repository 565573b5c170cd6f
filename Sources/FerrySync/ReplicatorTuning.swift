/// The replicator's internal tuning: values measured on this code's hot paths that users
/// have no reason to change, kept in one place so that a change to them is deliberate.
/// (Settings a deployment may want to change live in `ReplicatorConfiguration`.)
enum ReplicatorTuning {
    /// A pulled chunk of at least this many accepted revisions is inserted on the
    /// database's own thread while the puller suspends (judging the next chunk keeps a
    /// cooperative thread: 2 on a 2-core machine); a smaller one, as in live sync, is
    /// inserted in place, where two thread hand-offs would cost more than the insert
    /// (Benchmarks/README.md, "How the pull runs").
    static let suspendingInsertThreshold = 32

    /// How much later than a local edit a relayed revision goes out, on both sides of a
    /// link (`ReplicatorConfiguration.relayDelay`, `ReplicationResponder.Options.relayDelay`).
    static let relayDelay: Duration = .milliseconds(10)
}

import FerryCore

/// Names and numbers fixed by the replication protocol (docs/protocol.md).
public enum SyncProtocol {
    /// Protocol versions this build speaks, newest first.
    public static let versions: [Int] = [1]
    /// Request profiles.
    public enum Profile {
        public static let hello = "hello"
        public static let getCheckpoint = "getCheckpoint"
        public static let setCheckpoint = "setCheckpoint"
        public static let changes = "changes"
        public static let revsDiff = "revsDiff"
        public static let getRevs = "getRevs"
        public static let putRevs = "putRevs"
        public static let hasBlobs = "hasBlobs"
        public static let getBlob = "getBlob"
        public static let putBlob = "putBlob"
        /// No-reply liveness probe, sent by either side (docs/protocol.md §3 heartbeat).
        public static let heartbeat = "heartbeat"
    }
    /// `inline`: changes replies carry small fresh revisions, and caught-up pushes send them
    /// without revsDiff (docs/protocol.md §3.4). `heartbeat`: both sides send heartbeats on an
    /// idle connection and close it when the peer falls silent (docs/protocol.md §3 heartbeat).
    /// `skipReports`: changes replies and push checkpoint writes list the revisions left out
    /// as relays, so coverage never claims them early (docs/protocol.md §6).
    public static let features = ["deltas", "blobs", "inline", heartbeatFeature, skipReportsFeature]
    public static let heartbeatFeature = "heartbeat"
    public static let skipReportsFeature = "skipReports"

    /// The features this side offers in hello: all of them, less `heartbeat` when liveness is off.
    public static func features(liveness: Liveness) -> [String] {
        liveness.enabled ? features : features.filter { $0 != heartbeatFeature }
    }
    /// The most bytes of inline revision content a changes request may ask for, per revision.
    public static let maxInlineBytes: Int64 = 65536
}

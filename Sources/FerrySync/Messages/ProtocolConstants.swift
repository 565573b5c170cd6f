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
        /// Documents the receiver may no longer read (docs/protocol.md §3, access removal).
        public static let accessRemoved = "accessRemoved"
        /// Which documents the requester holds it may no longer read (docs/protocol.md §3).
        public static let accessCheck = "accessCheck"
    }
    /// `inline`: changes replies carry small fresh revisions, and caught-up pushes send them
    /// without revsDiff (docs/protocol.md §3.4). `heartbeat`: both sides send heartbeats on an
    /// idle connection and close it when the peer falls silent (docs/protocol.md §3 heartbeat).
    /// `skipReports`: changes replies and push checkpoint writes list the revisions left out
    /// as relays, so coverage never claims them early (docs/protocol.md §6).
    /// `blobChunks`: blobs move in ranged chunks and resume where they stopped (docs/protocol.md §3.7).
    /// `accessRemoval`: changes replies and pushes carry removal notices (docs/protocol.md §3.9).
    public static let features = [
        "deltas", "blobs", "inline", heartbeatFeature, skipReportsFeature, blobChunksFeature, accessRemovalFeature,
    ]
    public static let accessRemovalFeature = "accessRemoval"
    public static let heartbeatFeature = "heartbeat"
    public static let blobChunksFeature = "blobChunks"
    /// The most bytes one blob chunk carries. 256 KiB: at 2 Mbit/s it still crosses in about
    /// a second, so heartbeats and document requests queued behind it wait at most that long,
    /// while per-message costs (an envelope, a request, a read syscall) stay under 0.1 %.
    public static let blobChunkSize = 256 << 10
    /// Chunks a receiver or sender keeps in flight on one blob: enough to fill a LAN's
    /// bandwidth-delay product many times over, with at most 1 MiB queued ahead of other traffic.
    public static let blobChunkWindow = 4
    public static let skipReportsFeature = "skipReports"

    /// The features this side offers in hello: all of them, less `heartbeat` when liveness is off.
    public static func features(liveness: Liveness) -> [String] {
        liveness.enabled ? features : features.filter { $0 != heartbeatFeature }
    }
    /// The most bytes of inline revision content a changes request may ask for, per revision.
    public static let maxInlineBytes: Int64 = 65536
    /// The largest message a listener accepts from the peers that dial it, unless its owner
    /// says otherwise: the default of a node's `limits.maxMessageBytes` and of
    /// `WebSocketListener.Configuration.maxMessageSize`. Twice the largest document a node
    /// stores by default (8 MiB), so one revision always fits with its envelope.
    public static let defaultMaxMessageBytes = 16 << 20
    /// The largest message a dialer, or an endpoint over a pipe or socket, accepts: replies
    /// are not bounded by this node's settings but by the peer's, so a reply from a peer
    /// configured for larger documents still arrives.
    public static let maxReplyMessageBytes = 64 << 20
}

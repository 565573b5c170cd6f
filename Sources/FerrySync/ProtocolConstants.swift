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
    }
    /// `inline`: changes replies carry small fresh revisions, and caught-up pushes send them
    /// without revsDiff (docs/protocol.md §3.4).
    public static let features = ["deltas", "blobs", "inline"]
    /// The most bytes of inline revision content a changes request may ask for, per revision.
    public static let maxInlineBytes: Int64 = 65536
}

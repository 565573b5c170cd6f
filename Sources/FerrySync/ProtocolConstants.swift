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
    public static let features = ["deltas", "blobs"]
}

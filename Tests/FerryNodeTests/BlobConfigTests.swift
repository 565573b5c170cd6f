import FerryCore
import FerrySync
import Testing
@testable import FerryNode

/// The `blobs` settings: a node-wide fetch policy, per-peer ones, a replication's own, and
/// the age after which partial blobs are removed.
@Suite struct BlobConfigTests {
    static let peer = String(repeating: "ab", count: 32)

    @Test func blobPoliciesAreReadNodeWidePerPeerAndPerReplication() throws {
        let c = try NodeConfiguration.parse(
            [
                "blobs": ["fetch": "5MB", "peers": .object([Self.peer: "lazy"])],
                "blobCollection": ["partialMaxAgeSeconds": 600],
                "replications": [["url": "wss://127.0.0.1:4999/ferry/sync", "peer": .string(Self.peer), "blobs": 1000]],
            ], file: "test.json")
        #expect(c.blobPolicy == .eagerUpTo(5_000_000))
        #expect(c.blobPolicyByPeer[Self.peer] == .lazy)
        #expect(c.blobCollection.partialMaxAgeSeconds == 600)
        #expect(c.replications.first?.blobPolicy == .eagerUpTo(1000))
        #expect(c.replications.first?.json["blobs"] == "1000")
        #expect(try NodeConfiguration.parse([:], file: "test.json").blobPolicy == .eager)
    }

    @Test func aBadBlobPolicyNamesItsKey() {
        for bad: JSON in [["blobs": ["fetch": "sometimes"]], ["blobs": ["fetch": true]], ["blobs": ["peers": ["not-an-id": "lazy"]]],
            ["blobs": ["speed": "fast"]], ["replications": [["url": "http://127.0.0.1:5984/db", "blobs": "lazy"]]]]
        {
            #expect(throws: ConfigError.self) { try NodeConfiguration.parse(bad, file: "test.json") }
        }
        do {
            _ = try NodeConfiguration.parse(["blobs": ["fetch": "sometimes"]], file: "test.json")
        } catch {
            #expect(error.key == "blobs.fetch")
            #expect(error.reason.contains("eager, lazy or a size"))
        }
    }
}

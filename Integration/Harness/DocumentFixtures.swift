import Foundation

/// Documents for scenarios and benchmarks that need many of a known size.
public enum DocumentFixtures {
    /// Writes `count` documents of about 1 KiB (`doc-000000`…) as NDJSON for `ferry import`;
    /// returns the bytes of their JSON lines. The same call makes the same documents, so
    /// nodes that import them hold the same revisions.
    public static func writeKiBDocuments(_ count: Int, to path: String) throws -> Int {
        var out = ""
        var bytes = 0
        let filler = String(repeating: "x", count: 960)
        for i in 0..<count {
            let line = #"{"_id":"doc-\#(String(format: "%06d", i))","n":\#(i),"text":"\#(filler)"}"#
            bytes += line.utf8.count
            out += line + "\n"
        }
        try out.write(toFile: path, atomically: true, encoding: .utf8)
        return bytes
    }
}

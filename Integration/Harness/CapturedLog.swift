import FerryCore
import Logging

/// Collects what a logger is given, so a test can read what a component said.
public final class CapturedLog: Sendable {
    /// One log call: level, message and the merged metadata.
    public struct Record: Sendable {
        public let level: Logger.Level
        public let message: String
        public let metadata: Logger.Metadata
    }

    private let records = Locked<[Record]>([])

    public init() {}

    public var all: [Record] { records.withLock { $0 } }

    /// Each record as a stream handler would print it: level, message, then sorted metadata.
    public var lines: [String] {
        all.map { r in
            let text = r.metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            return "\(r.level) \(r.message) \(text)"
        }
    }

    public var logger: Logger { Logger(label: "captured") { _ in Handler(sink: self) } }

    struct Handler: LogHandler {
        let sink: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let record = Record(level: event.level, message: "\(event.message)", metadata: metadata.merging(event.metadata ?? [:]) { $1 })
            sink.records.withLock { $0.append(record) }
        }
    }
}

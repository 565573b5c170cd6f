import FerryCore
import Logging

/// Holds back log records below warning while `serve` starts, so a start-up that fails
/// prints only its one `ferry:` line; a node that becomes ready prints them then.
enum StartupLogs {
    private struct State {
        var holding = false
        var held: [@Sendable () -> Void] = []
    }

    private static let state = Locked(State())

    /// From now on, records below warning wait for `release`.
    static func hold() { state.withLock { $0.holding = true } }

    /// Prints the records held (unless `discarding`) and stops holding.
    static func release(discarding: Bool = false) {
        let held = state.withLock { state -> [@Sendable () -> Void] in
            defer { state = State() }
            return state.held
        }
        if !discarding { for write in held { write() } }
    }

    /// Keeps `write` for later while holding records of `level`; false when it should run now.
    static func holdBack(_ level: Logger.Level, _ write: @escaping @Sendable () -> Void) -> Bool {
        guard level < .warning else { return false }
        return state.withLock { state in
            guard state.holding else { return false }
            state.held.append(write)
            return true
        }
    }
}

/// A log handler whose records below warning wait while `StartupLogs` holds them.
struct StartupGatedLogHandler: LogHandler {
    var inner: any LogHandler

    func log(event: LogEvent) {
        let inner = self.inner
        if StartupLogs.holdBack(event.level, { inner.log(event: event) }) { return }
        inner.log(event: event)
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { inner.metadataProvider }
        set { inner.metadataProvider = newValue }
    }
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue }
    }
    var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue }
    }
    var logLevel: Logger.Level {
        get { inner.logLevel }
        set { inner.logLevel = newValue }
    }
}

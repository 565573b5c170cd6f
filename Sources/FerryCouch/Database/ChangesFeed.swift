import FerryCore
import FerryStore
import FerrySync
import Hummingbird
import NIOCore

/// Streams one `_changes` response in its feed's format: `normal` and `longpoll` as one
/// JSON object (results one per line), `continuous` as one JSON line per change, and
/// `eventsource` as server-sent events. Reads the store page by page, so memory stays
/// flat however long the feed; waits for commits between pages when the feed is live.
struct ChangesFeed<FeedClock: Clock<Duration>>: Sendable {
    let database: CouchDatabase
    let options: ChangesOptions
    let principal: CouchPrincipal
    /// The principal as it stands now; nil: the user was removed or its password changed.
    /// A feed that waits judges what comes after the wait by it, and ends once it is nil.
    var current: (@Sendable () -> CouchPrincipal?)? = nil
    /// The sequence the feed starts after (ascending) or before (descending; 0: the newest).
    let start: UInt64
    let clock: FeedClock

    /// Store rows read per page.
    static var pageSize: Int { 500 }

    /// What ended a wait for more changes.
    enum Wake: Sendable { case commit, tick, stop }

    func run(_ writer: inout any ResponseBodyWriter) async throws {
        switch options.feed {
        case .normal where options.descending: try await runDescending(&writer)
        case .normal, .longpoll: try await runObject(&writer)
        case .continuous, .eventsource: try await runStream(&writer)
        }
        try await writer.finish(nil)
    }

    // MARK: normal and longpoll

    /// `{"results":[…],"last_seq":…,"pending":…}`; a longpoll with nothing to list waits
    /// (sending heartbeat newlines) for a change it lists, its timeout, or the node's stop.
    private func runObject(_ writer: inout any ResponseBodyWriter) async throws {
        var buffer = ByteBuffer(string: "{\"results\":[\n")
        var cursor = start
        var sent = 0
        var limitReached = options.limit == 0
        let idleSince = clock.now
        var lastWrite = idleSince
        var principal = self.principal
        while true {
            if let current {
                guard let now = current() else {
                    principal = Self.nobody(principal)
                    break
                }
                principal = now
            }
            let snapshot = try database.store.lastSequence
            var exhausted = false
            while !limitReached && !exhausted {
                let page = try await BlockingIO.run { [database, cursor] in try database.store.changeEntries(after: cursor, limit: Self.pageSize) }
                exhausted = page.count < Self.pageSize
                for entry in page {
                    cursor = entry.change.sequence
                    guard let row = try database.changeRow(entry, options: options, principal: principal) else { continue }
                    if sent > 0 { buffer.writeString(",\n") }
                    buffer.writeBytes(row.canonicalBytes)
                    sent += 1
                    if let limit = options.limit, sent >= limit {
                        limitReached = true
                        break
                    }
                }
                if buffer.readableBytes > 0 {
                    try await writer.write(buffer)
                    buffer.clear()
                }
            }
            if !limitReached { cursor = max(cursor, snapshot) }
            if options.feed == .normal || sent > 0 || limitReached { break }
            let wake = await waitForMore(past: cursor, idleSince: idleSince, lastWrite: lastWrite)
            if wake == .stop { break }
            if wake == .tick {
                if timedOut(idleSince) { break }
                if heartbeatDue(lastWrite) {
                    try await writer.write(ByteBuffer(string: "\n"))
                    lastWrite = clock.now
                }
            }
        }
        buffer.writeString(sent > 0 ? "\n]," : "],")
        // How many changes follow: counted over every document, so told only to a reader of
        // everything (a restricted one would learn how much it may not see).
        if principal.policy.read.admitsEverything {
            let pending = try await BlockingIO.run { [database, cursor] in try database.store.changeCount(after: cursor) }
            buffer.writeString("\"last_seq\":\(cursor),\"pending\":\(pending)}\n")
        } else {
            buffer.writeString("\"last_seq\":\(cursor)}\n")
        }
        try await writer.write(buffer)
    }

    /// `feed=normal&descending=true`: newest first, before `since` when it is not 0.
    private func runDescending(_ writer: inout any ResponseBodyWriter) async throws {
        var buffer = ByteBuffer(string: "{\"results\":[\n")
        var before: UInt64? = start == 0 ? nil : start
        var cursor = start
        var sent = 0
        pages: while options.limit != 0 {
            let page = try await BlockingIO.run { [database, before] in try database.store.changeEntries(before: before, descending: true, limit: Self.pageSize) }
            for entry in page {
                cursor = entry.change.sequence
                before = cursor
                guard let row = try database.changeRow(entry, options: options, principal: principal) else { continue }
                if sent > 0 { buffer.writeString(",\n") }
                buffer.writeBytes(row.canonicalBytes)
                sent += 1
                if let limit = options.limit, sent >= limit { break pages }
            }
            if page.count < Self.pageSize { break }
            try await writer.write(buffer)
            buffer.clear()
        }
        let pending = try await BlockingIO.run { [database, cursor] in try database.store.changeCount(before: cursor) }
        buffer.writeString(sent > 0 ? "\n]," : "],")
        buffer.writeString("\"last_seq\":\(cursor),\"pending\":\(pending)}\n")
        try await writer.write(buffer)
    }

    // MARK: continuous and eventsource

    /// One line (or event) per change as it comes; heartbeats while idle; ends on the
    /// limit, the idle timeout or the node's stop, a continuous feed with its `last_seq` line.
    private func runStream(_ writer: inout any ResponseBodyWriter) async throws {
        var cursor = start
        var sent = 0
        var idleSince = clock.now
        var lastWrite = idleSince
        var buffer = ByteBuffer()
        var principal = self.principal
        feed: while true {
            if let limit = options.limit, sent >= limit { break }
            if let current {
                guard let now = current() else {
                    principal = Self.nobody(principal)
                    break feed
                }
                principal = now
            }
            let snapshot = try database.store.lastSequence
            var exhausted = false
            while !exhausted {
                let page = try await BlockingIO.run { [database, cursor] in try database.store.changeEntries(after: cursor, limit: Self.pageSize) }
                exhausted = page.count < Self.pageSize
                for entry in page {
                    cursor = entry.change.sequence
                    guard let row = try database.changeRow(entry, options: options, principal: principal) else { continue }
                    if options.feed == .eventsource {
                        buffer.writeString("data: ")
                        buffer.writeBytes(row.canonicalBytes)
                        buffer.writeString("\nid: \(entry.change.sequence)\n\n")
                    } else {
                        buffer.writeBytes(row.canonicalBytes)
                        buffer.writeString("\n")
                    }
                    sent += 1
                    idleSince = clock.now
                    if let limit = options.limit, sent >= limit {
                        try await writer.write(buffer)
                        break feed
                    }
                }
                if buffer.readableBytes > 0 {
                    try await writer.write(buffer)
                    buffer.clear()
                    lastWrite = clock.now
                }
            }
            cursor = max(cursor, snapshot)
            switch await waitForMore(past: cursor, idleSince: idleSince, lastWrite: lastWrite) {
            case .commit: continue
            case .tick:
                if timedOut(idleSince) { break feed }
                if heartbeatDue(lastWrite) {
                    try await writer.write(ByteBuffer(string: options.feed == .eventsource ? "event: heartbeat\ndata: \n\n" : "\n"))
                    lastWrite = clock.now
                }
            case .stop: break feed
            }
        }
        if options.feed == .continuous {
            // `pending` as in the object feeds: told only to a reader of everything.
            if principal.policy.read.admitsEverything {
                let pending = try await BlockingIO.run { [database, cursor] in try database.store.changeCount(after: cursor) }
                try await writer.write(ByteBuffer(string: "{\"last_seq\":\(cursor),\"pending\":\(pending)}\n"))
            } else {
                try await writer.write(ByteBuffer(string: "{\"last_seq\":\(cursor)}\n"))
            }
        }
    }

    // MARK: waiting

    /// What a feed whose user was removed mid-feed may still be told: nothing more.
    static func nobody(_ principal: CouchPrincipal) -> CouchPrincipal {
        .user(name: principal.name, policy: PeerPolicy(read: .none, write: .none, mayDelete: false))
    }

    private func timedOut(_ idleSince: FeedClock.Instant) -> Bool {
        guard let timeout = options.timeout else { return false }
        return idleSince.duration(to: clock.now) >= timeout
    }

    /// Whether a heartbeat is due: nothing was written for a heartbeat period. Counted from
    /// the last write, so that commits the feed does not list cannot starve the heartbeats.
    private func heartbeatDue(_ lastWrite: FeedClock.Instant) -> Bool {
        guard let heartbeat = options.heartbeat else { return false }
        return lastWrite.duration(to: clock.now) >= heartbeat
    }

    /// Waits for a commit past `sequence`, the next heartbeat or the timeout (`tick`), or
    /// the node's stop or the request's cancellation (`stop`).
    private func waitForMore(past sequence: UInt64, idleSince: FeedClock.Instant, lastWrite: FeedClock.Instant) async -> Wake {
        if database.shutdown.isFired || Task.isCancelled { return .stop }
        var tick: Duration?
        if let heartbeat = options.heartbeat {
            let left = heartbeat - lastWrite.duration(to: clock.now)
            if left <= .zero { return .tick }
            tick = left
        }
        if let timeout = options.timeout {
            let left = timeout - idleSince.duration(to: clock.now)
            if left <= .zero { return .tick }
            tick = min(tick ?? left, left)
        }
        let store = database.store
        let shutdown = database.shutdown
        let clock = self.clock
        var waits: [@Sendable () async throws -> Wake] = [
            {
                try await store.waitForCommit(past: sequence)
                return .commit
            },
            {
                await shutdown.wait()
                return .stop
            },
        ]
        if let tick {
            waits.append {
                try await clock.sleep(for: tick)
                return .tick
            }
        }
        let wake = (try? await Race.first(of: waits)) ?? .stop
        return Task.isCancelled || shutdown.isFired ? .stop : wake
    }
}

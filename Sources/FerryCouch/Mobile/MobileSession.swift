import FerryBLIP
import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOWebSocket

/// One Couchbase Lite replicator's connection, from its WebSocket upgrade to its close: reads
/// WebSocket frames into BLIP messages, answers each request (`MobileReplication`), matches
/// replies to the requests this side sent, and writes frames out in the order BLIP's outbox
/// gives them. A malformed frame closes the connection with a protocol error and a reason.
final class MobileSession: Sendable {
    let database: CouchDatabase
    let admission: MobileAdmission
    let logger: Logger
    let inserter: MobileInserter
    private let inserterTarget: Locked<MobileSession?>

    private struct Link {
        var blip = BLIPConnection()
        var replies: [UInt64: PendingReply] = [:]
        /// Replies being received as streams, by request number (their waiters are in `replies`).
        var streams: [UInt64: ReplyStream] = [:]
        /// Why the connection ended, once it has.
        var ended: String?
        /// Collection-aware (`getCollections` came first) or legacy (any other request came first).
        var mode: CollectionMode = .undecided
        /// Requests being answered, and the reader waiting for one to end (see `maxAnswering`).
        var answering = 0
        var readerWaiting: CheckedContinuation<Void, Never>?
        /// Whether a pull subscription (`subChanges`) runs: one per connection.
        var subscribed = false
    }

    /// Requests answered at once on one connection: past it the reader stops taking frames
    /// until one ends, so a client that floods requests is slowed, not served without bound
    /// (Couchbase Lite keeps far fewer in flight).
    static let maxAnswering = 256

    enum CollectionMode: Sendable { case undecided, legacy, collections }

    private let link = Locked(Link())
    /// The `sha1-` digests of blobs that came without one (from Ferry peers, CouchDB clients).
    let sha1Cache = Locked([BlobDigest: String]())
    /// Set when the connection ended: long waits (a continuous feed's) end with it.
    let closed = Latch<Void>()
    private let wakes: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation

    /// The users the principal is one of (nil: judged by the admission's principal throughout).
    let users: CouchUserTable?
    private let current: Locked<CouchPrincipal>
    /// Fired, then replaced, when the principal's policy changed (the feed judges again).
    let principalChange = Locked(Latch<Void>())
    /// The app's checkpoint ID (from `getCheckpoint` or `getCollections`).
    let checkpointClient = Locked<String?>(nil)
    /// The read rule the pull's changes up to its cursor were judged by (nil: no pull yet).
    let feedJudgedBy = Locked<AccessRule?>(nil)

    init(database: CouchDatabase, admission: MobileAdmission, users: CouchUserTable? = nil, logger: Logger) {
        self.database = database
        self.admission = admission
        self.users = users
        current = Locked(admission.principal)
        var logger = logger
        logger[metadataKey: "client"] = "\(admission.principal.name)@\(admission.remoteAddress ?? "?")"
        self.logger = logger
        // The session, for its inserter, until it ends (then the cycle is broken).
        let store = Locked<MobileSession?>(nil)
        inserterTarget = store
        inserter = MobileInserter { batch in
            guard let session = store.withLock({ $0 }) else { return batch.map { _ in .failure(MobileRequestError(code: 503, "closed")) } }
            return await session.store(batch)
        }
        (wakes, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
        store.withLock { $0 = self }
    }

    /// Who the connection acts for, with the policy of the moment: a user's policy changes
    /// (its own, or the group's rules) apply to the live connection, not only to the next one.
    var principal: CouchPrincipal { current.withLock { $0 } }

    /// Follows the user's entry until the connection ends: a new policy is applied (and the
    /// pull judged again); a removed user, or a changed password, ends the connection, as
    /// they end the user's cookie sessions.
    func followUser() async -> MobileClose? {
        guard let users, case .user(let name, _) = admission.principal else { return nil }
        let resolve = users.follow(admission.principal)
        while true {
            let next = users.nextChange()
            guard let now = resolve() else {
                end("the user was removed or its password changed")
                return MobileClose(code: .policyViolation, reason: "the user \(name) was removed or its password changed")
            }
            if now != principal {
                current.withLock { $0 = now }
                logger.info("the user's policy changed: the connection follows it")
                let fired = principalChange.withLock { latch -> Latch<Void> in
                    let old = latch
                    latch = Latch()
                    return old
                }
                fired.set(())
            }
            let closed = self.closed
            let waits: [@Sendable () async throws -> Bool] = [
                { @Sendable () async -> Bool in
                    _ = try? await next.wait()
                    return true
                },
                { @Sendable () async -> Bool in
                    _ = try? await closed.wait()
                    return false
                },
            ]
            let changed: Bool = (try? await Race.first(of: waits)) ?? false
            if !changed || Task.isCancelled { return nil }
        }
    }

    /// Serves the connection until the client closes it, it breaks, or the node stops.
    func run(_ ws: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>) async {
        logger.info("Couchbase Lite replicator connected", metadata: ["subprotocol": "\(admission.subprotocol)"])
        do {
            try await ws.executeThenClose { inbound, outbound in
                // Whichever ends first ends the connection: the client's side (its close, a
                // protocol error), the writer (a broken socket), or the node's stop.
                let outcome: MobileClose? = await withTaskGroup(of: MobileClose?.self) { group in
                    group.addTask {
                        do {
                            try await self.read(inbound, outbound: outbound)
                            return MobileClose(code: .normalClosure, reason: "the client closed the connection")
                        } catch let close as MobileClose {
                            return close
                        } catch {
                            return MobileClose(code: .goingAway, reason: "\(error)")
                        }
                    }
                    group.addTask {
                        do { try await self.pump(outbound) } catch let close as MobileClose { return close } catch {}
                        return nil
                    }
                    group.addTask { await self.followUser() }
                    group.addTask {
                        await self.database.shutdown.wait()
                        self.end("the node is stopping")
                        // 4001, Couchbase Lite's "transient": the app retries and resumes (it
                        // takes 1001, going away, as the end of the replication).
                        return MobileClose(code: .unknown(4001), reason: "the node is stopping")
                    }
                    // The writer ends quietly (nil) once `end` ran; the reason is the other side's.
                    var first: MobileClose?
                    for await result in group {
                        guard let result else { continue }
                        first = result
                        break
                    }
                    group.cancelAll()
                    return first
                }
                let close = outcome ?? MobileClose(code: .goingAway, reason: "the connection broke")
                self.end(close.reason)
                if close.code != .normalClosure || close.reason != "the client closed the connection" {
                    try? await outbound.write(Self.closeFrame(close))
                }
            }
        } catch {
            end("\(error)")
        }
        logger.info("Couchbase Lite replicator disconnected", metadata: ["reason": "\(link.withLock { $0.ended ?? "" })"])
    }

    /// Reads frames until the client's close; each whole request is answered in its own task.
    private func read(_ inbound: NIOAsyncChannelInboundStream<WebSocketFrame>, outbound: NIOAsyncChannelOutboundWriter<WebSocketFrame>) async throws {
        try await withThrowingDiscardingTaskGroup { requests in
            // Requests still being answered end with the connection (their waits for replies
            // are released by `end`), before the group waits for them.
            defer { requests.cancelAll() }
            do { try await readFrames(inbound, outbound: outbound, requests: &requests) } catch {
                end((error as? MobileClose)?.reason ?? "\(error)")
                throw error
            }
            end("the client closed the connection")
        }
    }

    private func readFrames(
        _ inbound: NIOAsyncChannelInboundStream<WebSocketFrame>, outbound: NIOAsyncChannelOutboundWriter<WebSocketFrame>,
        requests: inout ThrowingDiscardingTaskGroup<any Error>
    ) async throws {
        var partial: [UInt8]?
        for try await frame in inbound {
            logger.trace("WebSocket frame in", metadata: ["opcode": "\(frame.opcode)", "bytes": "\(frame.length)"])
            var bytes: [UInt8]
            switch frame.opcode {
            case .binary:
                guard partial == nil else { throw MobileClose(code: .protocolError, reason: "a binary frame began inside another message") }
                bytes = Array(frame.unmaskedData.readableBytesView)
                if !frame.fin {
                    partial = bytes
                    continue
                }
            case .continuation:
                guard var p = partial else { throw MobileClose(code: .protocolError, reason: "a continuation frame without a message") }
                p += frame.unmaskedData.readableBytesView
                guard p.count <= CouchHTTPChannel.maxWebSocketFrame else { throw MobileClose(code: .messageTooLarge, reason: "a BLIP frame exceeds 1 MiB") }
                if !frame.fin {
                    partial = p
                    continue
                }
                bytes = p
                partial = nil
            case .ping:
                try await outbound.write(WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData))
                continue
            case .pong:
                continue
            case .connectionClose:
                var data = frame.unmaskedData
                let code = data.readWebSocketErrorCode()
                try? await outbound.write(Self.closeFrame(MobileClose(code: code ?? .normalClosure, reason: "")))
                return
            default:
                throw MobileClose(code: .unacceptableData, reason: "Couchbase Lite's protocol sends binary frames only")
            }
            let received: BLIPConnection.Received?
            do { received = try link.withLock { try $0.blip.receiveAny(bytes) } } catch let e as BLIPError {
                throw MobileClose(code: .protocolError, reason: e.reason)
            }
            wake.yield()  // an ACK may be ready, or a message waiting for one may go on
            let message: BLIPMessage
            switch received {
            case nil: continue
            case .part(let part):
                deliver(part)
                continue
            case .message(let m): message = m
            }
            logger.trace("BLIP in", metadata: ["type": "\(message.type)", "number": "\(message.number)", "properties": "\(message.properties)"])
            switch message.type {
            case .request:
                await admitRequest()
                requests.addTask {
                    await self.answer(message)
                    self.requestEnded()
                }
            case .response, .error:
                let waiter = link.withLock { l in
                    l.streams[message.number] = nil
                    return l.replies.removeValue(forKey: message.number)
                }
                waiter?.set(.success(message))
            default:
                break
            }
        }
    }

    /// Writes frames as the outbox releases them, woken whenever something was queued or acknowledged.
    private func pump(_ outbound: NIOAsyncChannelOutboundWriter<WebSocketFrame>) async throws {
        for await _ in wakes {
            while true {
                // Every frame ready now goes out in one write (one flush, one system call).
                let ready: [[UInt8]]
                do {
                    ready = try link.withLock { l in
                        var frames: [[UInt8]] = []
                        while frames.count < 64, let next = try l.blip.nextOutgoing() { frames.append(next) }
                        return frames
                    }
                } catch let e as BLIPError {
                    throw MobileClose(code: .unexpectedServerError, reason: e.reason)
                }
                guard !ready.isEmpty else { break }
                try await outbound.write(contentsOf: ready.map { WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer(bytes: $0)) })
            }
        }
    }

    /// Waits until fewer than `maxAnswering` requests are being answered, then counts one more.
    private func admitRequest() async {
        while true {
            let admitted: Bool = link.withLock { l in
                guard l.answering >= Self.maxAnswering else {
                    l.answering += 1
                    return true
                }
                return false
            }
            if admitted { return }
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let resumeNow: Bool = link.withLock { l in
                    if l.answering < Self.maxAnswering || l.ended != nil { return true }
                    l.readerWaiting = c
                    return false
                }
                if resumeNow { c.resume() }
            }
            if link.withLock({ $0.ended != nil }) { return }
        }
    }

    private func requestEnded() {
        let waiter: CheckedContinuation<Void, Never>? = link.withLock { l in
            l.answering -= 1
            defer { l.readerWaiting = nil }
            return l.readerWaiting
        }
        waiter?.resume()
    }

    /// Claims the connection's one pull subscription; false when one already runs.
    func claimSubscription() -> Bool {
        link.withLock { l in
            if l.subscribed { return false }
            l.subscribed = true
            return true
        }
    }

    private func end(_ reason: String) {
        let waiters: [PendingReply] = link.withLock { l in
            if l.ended == nil { l.ended = reason }
            defer {
                l.replies = [:]
                l.streams = [:]
            }
            return Array(l.replies.values)
        }
        for w in waiters { w.set(.failure(MobileClose(code: .goingAway, reason: reason))) }
        link.withLock { l in
            defer { l.readerWaiting = nil }
            return l.readerWaiting
        }?.resume()
        wake.finish()
        closed.set(())
        inserterTarget.withLock { $0 = nil }
    }

    static func closeFrame(_ close: MobileClose) -> WebSocketFrame {
        var data = ByteBuffer()
        data.write(webSocketErrorCode: close.code)
        data.writeString(String(close.reason.prefix(120)))
        return WebSocketFrame(fin: true, opcode: .connectionClose, data: data)
    }

    // MARK: sending

    /// The wait for one request's reply (a response or an error), or for the connection's end.
    typealias PendingReply = Latch<Result<BLIPMessage, any Error>>

    /// Queues a request now, so requests go out in the order they were queued, and returns
    /// the wait for its reply (several may then be awaited at once). With `sink`, the reply's
    /// body goes to it as its frames arrive (a blob's content, never whole in memory) and the
    /// reply given is its head (its properties) once the last byte was taken; a sink that
    /// throws fails only this request.
    func queueRequest(_ message: BLIPMessage, streamingInto sink: (any MobileReplySink)? = nil) -> PendingReply {
        let pending = PendingReply()
        let failure: (any Error)? = link.withLock { l in
            if let ended = l.ended { return MobileClose(code: .goingAway, reason: ended) }
            do {
                let number = try l.blip.send(message, streamingReply: sink != nil)
                l.replies[number] = pending
                if let sink { l.streams[number] = ReplyStream(sink: sink) }
                return nil
            } catch { return error }
        }
        if let failure { pending.set(.failure(failure)) } else { wake.yield() }
        return pending
    }

    /// Sends a request and waits for its reply (a response or an error).
    func request(_ message: BLIPMessage, streamingInto sink: (any MobileReplySink)? = nil) async throws -> BLIPMessage {
        try await queueRequest(message, streamingInto: sink).wait().get()
    }

    /// Gives a streamed reply's part to its sink; the last part (or the sink's failure) ends its request.
    private func deliver(_ part: BLIPStreamPart) {
        guard let stream = link.withLock({ $0.streams[part.number] }) else { return }  // given up: dropped
        if let head = part.head { stream.head = head }
        var outcome: Result<BLIPMessage, any Error>?
        do {
            // A file write of one frame's bytes (at most a few KiB) into the page cache.
            try stream.sink.take(part.body)
            if part.isLast { outcome = .success(stream.head ?? BLIPMessage(type: .response, number: part.number)) }
        } catch {
            outcome = .failure(error)
        }
        guard let outcome else { return }
        let waiter = link.withLock { l in
            // A failed stream's later parts are dropped as they come (the reply stays streamed).
            l.streams[part.number] = nil
            return l.replies.removeValue(forKey: part.number)
        }
        waiter?.set(outcome)
    }

    /// Sends a request that wants no reply.
    func post(_ message: BLIPMessage) throws {
        var m = message
        m.flags.insert(.noReply)
        try link.withLock { l in
            if let ended = l.ended { throw MobileClose(code: .goingAway, reason: ended) }
            try l.blip.send(m)
        }
        wake.yield()
    }

    func respond(to request: BLIPMessage, properties: [(String, String)] = [], body: [UInt8] = []) {
        link.withLock { l in
            guard l.ended == nil else { return }
            try? l.blip.respond(to: request, properties: properties, body: body, compressed: body.count > 256)
        }
        wake.yield()
    }

    /// Answers a request with a body read from `source` as it is sent (a blob's content).
    func respond(to request: BLIPMessage, properties: [(String, String)] = [], body source: any BLIPBodySource) {
        link.withLock { l in
            guard l.ended == nil else { return }
            try? l.blip.respond(to: request, properties: properties, body: source)
        }
        wake.yield()
    }

    func respond(to request: BLIPMessage, json: JSON, properties: [(String, String)] = []) {
        respond(to: request, properties: properties, body: json.canonicalBytes)
    }

    /// Answers a request with an error: `domain` HTTP for statuses, BLIP for the protocol's own.
    func fail(_ request: BLIPMessage, domain: String = "HTTP", code: Int, _ message: String) {
        link.withLock { l in
            guard l.ended == nil else { return }
            try? l.blip.fail(request, domain: domain, code: code, message: message)
        }
        wake.yield()
    }

    /// Checks the request's `collection` against the connection's mode (fixed by its first request).
    func checkCollection(_ request: BLIPMessage) throws(MobileRequestError) {
        let given = request["collection"]
        let mode: CollectionMode = link.withLock { l in
            if l.mode == .undecided { l.mode = request.profile == "getCollections" ? .collections : .legacy }
            return l.mode
        }
        switch mode {
        case .collections:
            guard request.profile == "getCollections" || given == "0" else {
                throw MobileRequestError(domain: "BLIP", code: 400, "this connection replicates one collection, index 0 (_default._default)")
            }
        default:
            guard given == nil else {
                throw MobileRequestError(domain: "BLIP", code: 400, "a collection index needs getCollections first")
            }
        }
    }
}

/// Takes the body of a reply received as a stream, a frame's bytes at a time, in order.
protocol MobileReplySink: AnyObject, Sendable {
    func take(_ bytes: [UInt8]) throws
}

/// A reply being received as a stream: where its body goes, and its head once it came. Only
/// the connection's reader touches it.
final class ReplyStream: @unchecked Sendable {
    // @unchecked: `head` is written and read only by the connection's reader task.
    let sink: any MobileReplySink
    var head: BLIPMessage?
    init(sink: any MobileReplySink) { self.sink = sink }
}

/// Closes the WebSocket with a code and a reason.
struct MobileClose: Error, CustomStringConvertible {
    let code: WebSocketErrorCode
    let reason: String
    var description: String { reason }
}

/// A request answered with an error reply.
struct MobileRequestError: Error {
    let domain: String
    let code: Int
    let message: String
    init(domain: String = "HTTP", code: Int, _ message: String) {
        self.domain = domain
        self.code = code
        self.message = message
    }
}

/// One revision an app pushed, parsed and waiting to be checked and stored.
struct PushedRevision: Sendable {
    let id: DocumentID
    let rev: RevisionID
    let history: [RevisionID]
    let input: CouchDocumentInput
    let noConflicts: Bool
}

/// Gathers the revisions an app pushes into batches: those that arrive while a batch is
/// being checked and written go in the next one, so a busy push costs one tree read and one
/// transaction per batch rather than per revision; each caller waits for its own answer,
/// given only once its revision is durable. Two revisions of one document never share a
/// batch (the second is checked against the tree the first made).
final class MobileInserter: Sendable {
    typealias Answer = Result<Void, MobileRequestError>
    private struct Pending {
        var items: [(PushedRevision, CheckedContinuation<Answer, Never>)] = []
        var flushing = false
    }

    private let pending = Locked(Pending())
    private let process: @Sendable ([PushedRevision]) async -> [Answer]

    init(process: @escaping @Sendable ([PushedRevision]) async -> [Answer]) { self.process = process }

    func insert(_ revision: PushedRevision) async -> Answer {
        await withCheckedContinuation { cont in
            let lead = pending.withLock { p in
                p.items.append((revision, cont))
                if p.flushing { return false }
                p.flushing = true
                return true
            }
            guard lead else { return }
            // Unowned: one flush at a time (`flushing`); it ends once the queue it drains is empty.
            Task { await self.flush() }
        }
    }

    private func flush() async {
        while true {
            let batch: [(PushedRevision, CheckedContinuation<Answer, Never>)] = pending.withLock { p in
                var seen = Set<DocumentID>()
                var take: [(PushedRevision, CheckedContinuation<Answer, Never>)] = []
                var keep: [(PushedRevision, CheckedContinuation<Answer, Never>)] = []
                for item in p.items {
                    if seen.insert(item.0.id).inserted { take.append(item) } else { keep.append(item) }
                }
                p.items = keep
                if take.isEmpty { p.flushing = false }
                return take
            }
            if batch.isEmpty { return }
            let answers = await process(batch.map(\.0))
            for (item, answer) in zip(batch, answers) { item.1.resume(returning: answer) }
        }
    }
}

import FerryCore
import CDNSSD
import Dispatch
import Foundation
import Logging
import ServiceLifecycle

// One file by design (hence its length): the `@unchecked Sendable` below (mutable state only on
// `queue`) can be checked only with every handle, lookup and private C callback that reaches it in view.

/// Advertises this node as `_ferry._tcp` and browses, resolves and looks up the A
/// records of the other Ferry nodes, through Avahi's dns_sd compat library.
///
/// Hand-rolled over the C API because no listed Swift package wraps DNS-SD on Linux.
/// Every dns_sd handle is driven by a DispatchSource on its socket (never a blocking
/// ProcessResult loop, which deadlocks Avahi). Losing avahi-daemon or D-Bus at any moment
/// is a logged, recovered event: the session is torn down and started again on the
/// injected clock, with a backoff that doubles from `retryInterval` up to
/// `maximumRetryInterval`; the first failure is logged once as a warning, later ones at
/// debug level. No callback of the library can reach freed state: each handle's context
/// is a box retained until the handle is deallocated, pointing weakly at its receiver,
/// and Avahi's allocations are zero-filled (`ZeroFilledAvahiMemory`).
public final class DNSSDDiscovery: PeerDiscovery, @unchecked Sendable {
    // @unchecked Sendable: every mutable field below is touched only on `queue`, which
    // also runs all dns_sd callbacks; dns_sd handles are not thread-safe.

    /// What to advertise and how to retry.
    public struct Configuration: Sendable {
        /// This node's advertisement; nil browses only.
        public var advertisement: Advertisement?
        /// Only report peers of this group (nil: any group).
        public var group: String?
        /// The first wait before retrying after avahi-daemon is unreachable or went away.
        public var retryInterval: Duration = .seconds(5)
        /// The longest wait between retries: each failed attempt doubles the wait up to this.
        public var maximumRetryInterval: Duration = .seconds(60)
        public init(advertisement: Advertisement?, group: String?) {
            self.advertisement = advertisement
            self.group = group
        }

        /// The wait before retry number `attempt` (0 after a session worked or at the start):
        /// `retryInterval` doubled per attempt, at most `maximumRetryInterval` (never below
        /// `retryInterval`).
        public func retryDelay(attempt: Int) -> Duration {
            let cap = max(retryInterval, maximumRetryInterval)
            var delay = retryInterval
            for _ in 0..<max(0, attempt) where delay < cap { delay *= 2 }
            return min(delay, cap)
        }
    }

    public let configuration: Configuration
    public let events: AsyncStream<DiscoveryEvent>
    let eventSink: AsyncStream<DiscoveryEvent>.Continuation
    let clock: any Clock<Duration>
    let logger: Logger
    let queue = DispatchQueue(label: "ferry.dnssd")

    enum Signal: Sendable { case failed(String, session: Int), retry(Int), shutdown }
    let signals: AsyncStream<Signal>
    let signalSink: AsyncStream<Signal>.Continuation

    // Queue-confined state.
    var registration: DNSSDHandle?
    var browse: DNSSDHandle?
    var lookups: [String: PeerLookup] = [:]
    var sessionAlive = false
    /// Numbers sessions, so a late failure report of an ended one is ignored.
    var session = 0
    var currentAdvertisement: Advertisement?
    /// dns_sd handles not yet deallocated (each one holds a thread and a D-Bus connection).
    var liveHandles = 0
    /// Entered per live handle, left once it is deallocated: `run` returns after the last.
    let handleGroup = DispatchGroup()
    let firstOutcome = Latch<DiscoveryAvailability>()

    public init(configuration: Configuration, clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "ferry.discovery")) {
        // The compat library prints a three-line warning per process unless this is set.
        setenv("AVAHI_COMPAT_NOWARN", "1", 1)
        ZeroFilledAvahiMemory.install()
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        (events, eventSink) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        (signals, signalSink) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        currentAdvertisement = configuration.advertisement
    }

    /// Sets what to advertise (call before `run`, e.g. once an ephemeral port is bound).
    public func advertise(_ advertisement: Advertisement) {
        queue.sync { currentAdvertisement = advertisement }
    }

    public func firstAvailability() async throws -> DiscoveryAvailability { try await firstOutcome.wait() }

    /// How many dns_sd handles are not yet deallocated (0 once `run` has returned).
    public func openHandleCount() async -> Int { await onQueue { self.liveHandles } }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await self.runSessions()
        } onGracefulShutdown: {
            self.markShutdown()
            self.signalSink.yield(.shutdown)
        }
    }

    /// Starts sessions until shutdown, retrying with backoff while avahi is unreachable;
    /// returns once every dns_sd handle is deallocated.
    func runSessions() async {
        var warned = false
        var attempt = 0
        var retryTask: Task<Void, Never>?
        var retryNumber = 0
        func scheduleRetry() -> Duration {
            let delay = configuration.retryDelay(attempt: attempt)
            attempt += 1
            retryNumber += 1
            let clock = self.clock, sink = signalSink, number = retryNumber
            retryTask?.cancel()
            retryTask = Task {
                do { try await clock.sleep(for: delay) } catch { return }
                sink.yield(.retry(number))
            }
            return delay
        }
        var signals = self.signals.makeAsyncIterator()
        session: while !isShuttingDown {
            var waitingFor: Int?
            let (failure, started) = await onQueue { (self.startSession(), self.session) }
            if let failure {
                let delay = scheduleRetry()
                if !warned {
                    logger.warning(
                        "DNS-SD unavailable; static peers and group members are still dialled at their known addresses, retrying in the background",
                        metadata: ["reason": "\(failure)", "retry": "\(delay)"])
                    warned = true
                } else {
                    logger.debug("DNS-SD still unavailable", metadata: ["reason": "\(failure)", "retry": "\(delay)"])
                }
                eventSink.yield(.unavailable(reason: failure))
                firstOutcome.set(.unavailable(reason: failure))
                waitingFor = retryNumber
            } else {
                if warned { logger.notice("DNS-SD available again") }
                warned = false
                attempt = 0
                eventSink.yield(.available)
                firstOutcome.set(.available)
            }
            while let signal = await signals.next() {
                switch signal {
                case .shutdown:
                    break session
                case .retry(let number):
                    if waitingFor == number { continue session }
                case .failed(let reason, let failedSession):
                    guard waitingFor == nil, failedSession == started else { continue }
                    // avahi-daemon or D-Bus went away: nothing re-registers by itself.
                    await onQueue { self.teardown() }
                    let delay = scheduleRetry()
                    logger.warning(
                        "DNS-SD session lost (avahi-daemon or D-Bus went away); registering again when it is back",
                        metadata: ["reason": "\(reason)", "retry": "\(delay)"])
                    warned = true
                    eventSink.yield(.unavailable(reason: reason))
                    waitingFor = retryNumber
                }
            }
            break session
        }
        retryTask?.cancel()
        await onQueue { self.teardown() }
        // The handles end on the queue after their sources are cancelled; wait for the last,
        // so nothing of Avahi's runs for this object once `run` has returned.
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            handleGroup.notify(queue: .global()) { c.resume() }
        }
        firstOutcome.set(.unavailable(reason: "stopped"))
        eventSink.finish()
    }

    /// Runs `body` on the queue without blocking a thread of the caller's executor (dns_sd
    /// calls may wait on D-Bus).
    func onQueue<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { c in queue.async { c.resume(returning: body()) } }
    }

    private let shutdownFlag = ShutdownFlag()
    var isShuttingDown: Bool { shutdownFlag.isSet }
    func markShutdown() { shutdownFlag.set() }

    // MARK: session (on queue)

    /// Registers and browses; returns a reason when avahi is unreachable.
    func startSession() -> String? {
        dispatchPrecondition(condition: .onQueue(queue))
        if isShuttingDown { return nil }
        session += 1
        if let ad = currentAdvertisement {
            var txt = TXTRecordRef()
            TXTRecordCreate(&txt, 0, nil)
            defer { TXTRecordDeallocate(&txt) }
            for (key, value) in ad.txt.sorted(by: { $0.key < $1.key }) {
                let bytes = Array(value.utf8)
                _ = TXTRecordSetValue(&txt, key, UInt8(bytes.count), bytes)
            }
            let (handle, err) = makeHandle(for: self) { ref, context in
                DNSServiceRegister(
                    &ref, 0, 0, ad.instanceName, Advertisement.serviceType, nil, nil, UInt16(ad.port).bigEndian,
                    TXTRecordGetLength(&txt), TXTRecordGetBytesPtr(&txt), registerReply, context)
            }
            guard let handle else { return "DNSServiceRegister failed: \(describe(err))" }
            registration = handle
        }
        let (handle, err) = makeHandle(for: self) { ref, context in
            DNSServiceBrowse(&ref, 0, 0, Advertisement.serviceType, nil, browseReply, context)
        }
        guard let handle else {
            teardown()
            return "DNSServiceBrowse failed: \(describe(err))"
        }
        browse = handle
        sessionAlive = true
        return nil
    }

    /// Starts one dns_sd operation whose callbacks reach `receiver` (weakly, through a
    /// context box that lives until the ref is deallocated); nil and the error when it fails.
    func makeHandle<Receiver: AnyObject>(
        for receiver: Receiver, _ start: (inout DNSServiceRef?, UnsafeMutableRawPointer) -> DNSServiceErrorType
    ) -> (DNSSDHandle?, DNSServiceErrorType) {
        dispatchPrecondition(condition: .onQueue(queue))
        let context = Unmanaged.passRetained(CallbackContext(receiver))
        var ref: DNSServiceRef?
        let err = start(&ref, context.toOpaque())
        guard err == kDNSServiceErr_NoError, let ref else {
            // The library frees a ref it could not set up, so nothing can call back any more.
            context.release()
            return (nil, err == kDNSServiceErr_NoError ? DNSServiceErrorType(kDNSServiceErr_Unknown) : err)
        }
        let fd = DNSServiceRefSockFD(ref)
        guard fd >= 0 else {
            DNSServiceRefDeallocate(ref)
            context.release()
            return (nil, DNSServiceErrorType(kDNSServiceErr_Unknown))
        }
        liveHandles += 1
        handleGroup.enter()
        let group = handleGroup
        let handle = DNSSDHandle(ref: ref, fd: fd, queue: queue, owner: self) { [weak self] in
            context.release()
            self?.liveHandles -= 1
            group.leave()
        }
        return (handle, err)
    }

    func teardown() {
        dispatchPrecondition(condition: .onQueue(queue))
        registration?.cancel()
        registration = nil
        browse?.cancel()
        browse = nil
        for lookup in lookups.values { lookup.cancel() }
        lookups.removeAll()
        sessionAlive = false
    }

    /// Called on the queue when a handle fails; ends the session once.
    func sessionFailed(_ reason: String) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard sessionAlive else { return }
        sessionAlive = false
        signalSink.yield(.failed(reason, session: session))
    }

    func registered(name: String, error: DNSServiceErrorType) {
        if error == kDNSServiceErr_NoError {
            logger.info("advertising on DNS-SD", metadata: ["instance": "\(LogText.escape(name))", "type": "\(Advertisement.serviceType)"])
        } else {
            sessionFailed("registration: \(describe(error))")
        }
    }

    func browsed(instance: String, domain: String, interface: UInt32, added: Bool, error: DNSServiceErrorType) {
        guard error == kDNSServiceErr_NoError else { return sessionFailed("browse: \(describe(error))") }
        guard sessionAlive else { return }
        if added {
            if let lookup = lookups[instance] {
                lookup.interfaces += 1
                // The instance announced again (on another interface, or re-registered by a
                // restarted node, perhaps on another port): resolve it again, so that a port
                // resolved once is never kept after the service moved.
                lookup.resolve()
                return
            }
            let lookup = PeerLookup(instance: instance, domain: domain, interface: interface, owner: self)
            lookups[instance] = lookup
            lookup.resolve()
        } else if let lookup = lookups[instance] {
            lookup.interfaces -= 1
            guard lookup.interfaces <= 0 else { return }
            lookup.cancel()
            lookups[instance] = nil
            if lookup.reported { eventSink.yield(.disappeared(instance: instance)) }
        }
    }

    /// A lookup found (or refreshed) a peer with at least one address.
    func found(_ peer: DiscoveredPeer, lookup: PeerLookup) {
        if peer.nodeID == currentAdvertisement?.nodeID { return lookup.cancel() }  // ourselves
        if let group = configuration.group, peer.group != group {
            logger.debug(
                "ignoring a Ferry node of another group",
                metadata: ["instance": "\(LogText.escape(peer.instance))", "group": "\(LogText.escape(peer.group))"])
            return lookup.cancel()
        }
        lookup.reported = true
        eventSink.yield(.appeared(peer))
    }
}

/// Makes every allocation of Avahi's libraries zero-filled, once per process.
///
/// Avahi 0.8's compat library (Debian 12's libdns_sd.so.1) allocates a DNSServiceRef with
/// plain `avahi_malloc` and sets only the callback field of the operation it starts. When
/// the client fails (avahi-daemon or D-Bus gone), its `generic_client_callback` calls the
/// first non-null of the browse, resolve, domain and record-query callback fields, so a
/// resolve or record-query ref jumps through leftover heap bytes: SIGSEGV on a dispatch
/// thread in libdns_sd. Upstream zeroes the ref since 2024 (avahi/avahi#569); this does the
/// same from outside, through avahi-common's allocator hook, for every Avahi version.
enum ZeroFilledAvahiMemory {
    private static let installed: Void = {
        // Never freed: Avahi keeps the pointer for the life of the process.
        let table = UnsafeMutablePointer<AvahiAllocator>.allocate(capacity: 1)
        table.initialize(to: AvahiAllocator(
            malloc: { size in calloc(1, size) },
            free: { pointer in free(pointer) },
            realloc: { pointer, size in realloc(pointer, size) },
            calloc: { count, size in calloc(count, size) }))
        avahi_set_allocator(table)
    }()

    /// Installs the allocator (before the first dns_sd call; later calls do nothing).
    static func install() { _ = installed }
}

/// A set-once flag readable from any thread.
final class ShutdownFlag: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.withLock { value } }
    func set() { lock.withLock { value = true } }
}

func describe(_ error: DNSServiceErrorType) -> String {
    switch Int(error) {
    case Int(kDNSServiceErr_Unknown): return "avahi-daemon not reachable (\(error))"
    case Int(kDNSServiceErr_NameConflict): return "name conflict (\(error))"
    case Int(kDNSServiceErr_Unsupported): return "unsupported by Avahi's compat library (\(error))"
    default: return "dns_sd error \(error)"
    }
}

/// The context pointer of one dns_sd handle's callbacks: retained until the handle's ref is
/// deallocated, so a callback never finds it freed, and pointing weakly at its receiver,
/// so it never keeps one alive (a callback for a receiver that is gone does nothing).
final class CallbackContext<Receiver: AnyObject> {
    weak var receiver: Receiver?
    init(_ receiver: Receiver) { self.receiver = receiver }

    /// The receiver of the callback whose context is `pointer`, if it still exists.
    static func receiver(_ pointer: UnsafeMutableRawPointer?) -> Receiver? {
        guard let pointer else { return nil }
        return Unmanaged<CallbackContext<Receiver>>.fromOpaque(pointer).takeUnretainedValue().receiver
    }
}

/// One dns_sd handle driven by a DispatchSource on its socket; the ref is deallocated in
/// the source's cancel handler, after the last event handler (the order Avahi needs), and
/// only then is `deallocated` called (which releases the callbacks' context).
final class DNSSDHandle {
    private let source: DispatchSourceRead

    init(ref: DNSServiceRef, fd: Int32, queue: DispatchQueue, owner: DNSSDDiscovery, deallocated: @escaping () -> Void) {
        source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { [weak owner] in
            let err = DNSServiceProcessResult(ref)
            if err != kDNSServiceErr_NoError { owner?.sessionFailed("process result: \(describe(err))") }
        }
        source.setCancelHandler {
            DNSServiceRefDeallocate(ref)
            deallocated()
        }
        source.resume()
    }

    func cancel() { source.cancel() }

    // A handle dropped without `cancel` must still end its ref.
    deinit { source.cancel() }
}

/// Resolves one browsed instance (host, port, TXT), then follows its A records.
final class PeerLookup {
    let instance: String
    let domain: String
    let interface: UInt32
    weak var owner: DNSSDDiscovery?
    var interfaces = 1
    var reported = false
    var resolveHandle: DNSSDHandle?
    var queryHandle: DNSSDHandle?
    var peer: DiscoveredPeer?

    init(instance: String, domain: String, interface: UInt32, owner: DNSSDDiscovery) {
        self.instance = instance
        self.domain = domain
        self.interface = interface
        self.owner = owner
    }

    func resolve() {
        guard let owner, resolveHandle == nil else { return }
        let (handle, err) = owner.makeHandle(for: self) { ref, context in
            DNSServiceResolve(&ref, 0, interface, instance, Advertisement.serviceType, domain, resolveReply, context)
        }
        guard let handle else {
            owner.logger.debug("resolve failed", metadata: ["instance": "\(LogText.escape(instance))", "error": "\(describe(err))"])
            return
        }
        resolveHandle = handle
    }

    func resolved(host: String, port: Int, txt: [String: String]) {
        resolveHandle?.cancel()
        resolveHandle = nil
        guard let owner else { return }
        guard let id = txt["id"].flatMap(NodeIDFormat.normalized) else {
            owner.logger.debug("a _ferry._tcp service without a valid id TXT key", metadata: ["instance": "\(LogText.escape(instance))"])
            return
        }
        let fresh = DiscoveredPeer(
            instance: instance, nodeID: id, group: txt["group"] ?? "", protocolVersion: Int(txt["proto"] ?? "") ?? 0,
            host: host, addresses: [], port: port, source: .dnsSD)
        // Resolved again, same host: its A records are followed already; report the new port
        // (or TXT) at once with the addresses known.
        if var known = peer, known.host == host, queryHandle != nil {
            let changed = known.port != port || known.nodeID != id || known.group != fresh.group
            known.port = port
            known.nodeID = id
            known.group = fresh.group
            known.protocolVersion = fresh.protocolVersion
            peer = known
            if changed, !known.addresses.isEmpty { owner.found(known, lookup: self) }
            return
        }
        queryHandle?.cancel()
        queryHandle = nil
        peer = fresh
        // A records only: Avahi's AAAA answers can be link-local without a scope.
        let (handle, err) = owner.makeHandle(for: self) { ref, context in
            DNSServiceQueryRecord(
                &ref, 0, interface, host, UInt16(kDNSServiceType_A), UInt16(kDNSServiceClass_IN), queryReply, context)
        }
        guard let handle else {
            owner.logger.debug("A-record query failed", metadata: ["host": "\(LogText.escape(host))", "error": "\(describe(err))"])
            return
        }
        queryHandle = handle
    }

    /// The resolve or the record query reported an error (a timeout, or the daemon gone,
    /// which the browse reports too): that operation ends; the browse decides the rest.
    func failed(_ operation: String, _ error: DNSServiceErrorType) {
        owner?.logger.debug(
            "DNS-SD lookup ended", metadata: ["instance": "\(LogText.escape(instance))", "operation": "\(operation)", "error": "\(describe(error))"])
        if operation == "resolve" {
            resolveHandle?.cancel()
            resolveHandle = nil
        } else {
            queryHandle?.cancel()
            queryHandle = nil
        }
    }

    func address(_ address: String, added: Bool) {
        guard var peer else { return }
        if added {
            guard !peer.addresses.contains(address) else { return }
            peer.addresses.append(address)
        } else {
            peer.addresses.removeAll { $0 == address }
            if peer.addresses.isEmpty { self.peer = peer; return }
        }
        self.peer = peer
        owner?.found(peer, lookup: self)
    }

    func cancel() {
        resolveHandle?.cancel()
        resolveHandle = nil
        queryHandle?.cancel()
        queryHandle = nil
    }
}

// MARK: C callbacks (no captures allowed; the context pointer carries a CallbackContext)

private let registerReply: DNSServiceRegisterReply = { _, _, error, name, _, _, context in
    guard let owner = CallbackContext<DNSSDDiscovery>.receiver(context) else { return }
    owner.registered(name: name.map { String(cString: $0) } ?? "?", error: error)
}

private let browseReply: DNSServiceBrowseReply = { _, flags, interface, error, name, _, domain, context in
    guard let owner = CallbackContext<DNSSDDiscovery>.receiver(context) else { return }
    owner.browsed(
        instance: name.map { String(cString: $0) } ?? "", domain: domain.map { String(cString: $0) } ?? "local.",
        interface: interface, added: flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0, error: error)
}

private let resolveReply: DNSServiceResolveReply = { _, _, _, error, _, host, port, txtLength, txtBytes, context in
    guard let lookup = CallbackContext<PeerLookup>.receiver(context) else { return }
    guard error == kDNSServiceErr_NoError, let host else { return lookup.failed("resolve", error) }
    var txt: [String: String] = [:]
    for key in ["id", "proto", "group"] {
        var length: UInt8 = 0
        if let value = TXTRecordGetValuePtr(txtLength, txtBytes, key, &length) {
            txt[key] = String(decoding: UnsafeRawBufferPointer(start: value, count: Int(length)), as: UTF8.self)
        }
    }
    lookup.resolved(host: String(cString: host), port: Int(UInt16(bigEndian: port)), txt: txt)
}

private let queryReply: DNSServiceQueryRecordReply = { _, flags, _, error, _, type, _, length, data, _, context in
    guard let lookup = CallbackContext<PeerLookup>.receiver(context) else { return }
    guard error == kDNSServiceErr_NoError else { return lookup.failed("query", error) }
    guard type == UInt16(kDNSServiceType_A), length == 4, let data else { return }
    let b = data.assumingMemoryBound(to: UInt8.self)
    lookup.address("\(b[0]).\(b[1]).\(b[2]).\(b[3])", added: flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0)
}

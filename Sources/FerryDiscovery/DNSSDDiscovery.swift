import FerryCore
import CDNSSD
import Dispatch
import Foundation
import Logging
import ServiceLifecycle

/// Advertises this node as `_ferry._tcp` and browses, resolves and looks up the A
/// records of the other Ferry nodes, through Avahi's dns_sd compat library.
///
/// Hand-rolled over the C API because no listed Swift package wraps DNS-SD on Linux.
/// Every dns_sd handle is driven by a DispatchSource on its socket (never a blocking
/// ProcessResult loop, which deadlocks Avahi). When avahi-daemon is absent or restarts,
/// the session is torn down and retried on the injected clock; the first failure is
/// logged once as a warning, later ones at debug level.
public final class DNSSDDiscovery: PeerDiscovery, @unchecked Sendable {
    // @unchecked Sendable: every mutable field below is touched only on `queue`, which
    // also runs all dns_sd callbacks; dns_sd handles are not thread-safe.

    /// What to advertise and how to retry.
    public struct Configuration: Sendable {
        /// This node's advertisement; nil browses only.
        public var advertisement: Advertisement?
        /// Only report peers of this group (nil: any group).
        public var group: String?
        /// Wait before retrying after avahi-daemon is unreachable or restarted.
        public var retryInterval: Duration = .seconds(5)
        public init(advertisement: Advertisement?, group: String?) {
            self.advertisement = advertisement
            self.group = group
        }
    }

    public let configuration: Configuration
    public let events: AsyncStream<DiscoveryEvent>
    let eventSink: AsyncStream<DiscoveryEvent>.Continuation
    let clock: any Clock<Duration>
    let logger: Logger
    let queue = DispatchQueue(label: "ferry.dnssd")

    enum Signal: Sendable { case failed(String), retry, shutdown }
    let signals: AsyncStream<Signal>
    let signalSink: AsyncStream<Signal>.Continuation

    // Queue-confined state.
    var registration: DNSSDHandle?
    var browse: DNSSDHandle?
    var lookups: [String: PeerLookup] = [:]
    var sessionAlive = false
    var currentAdvertisement: Advertisement?
    let firstOutcome = Latch<DiscoveryAvailability>()

    public init(configuration: Configuration, clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "ferry.discovery")) {
        // The compat library prints a three-line warning per process unless this is set.
        setenv("AVAHI_COMPAT_NOWARN", "1", 1)
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

    public func run() async throws {
        var warned = false
        var retryTask: Task<Void, Never>?
        func scheduleRetry() {
            let clock = self.clock, interval = configuration.retryInterval, sink = signalSink
            retryTask = Task {
                try? await clock.sleep(for: interval)
                sink.yield(.retry)
            }
        }
        await withGracefulShutdownHandler {
            var signals = self.signals.makeAsyncIterator()
            session: while !isShuttingDown {
                var waitingForRetry = false
                if let failure = queue.sync(execute: { startSession() }) {
                    if !warned {
                        logger.warning(
                            "DNS-SD unavailable; static peers still work, retrying in the background",
                            metadata: ["reason": "\(failure)", "retry": "\(configuration.retryInterval)"])
                        warned = true
                    } else {
                        logger.debug("DNS-SD still unavailable", metadata: ["reason": "\(failure)"])
                    }
                    eventSink.yield(.unavailable(reason: failure))
                    firstOutcome.set(.unavailable(reason: failure))
                    waitingForRetry = true
                    scheduleRetry()
                } else {
                    if warned { logger.notice("DNS-SD available again") }
                    warned = false
                    eventSink.yield(.available)
                    firstOutcome.set(.available)
                }
                while let signal = await signals.next() {
                    switch signal {
                    case .shutdown:
                        break session
                    case .retry:
                        if waitingForRetry { continue session }
                    case .failed(let reason):
                        if waitingForRetry { continue }
                        // avahi-daemon went away or restarted: nothing re-registers by itself.
                        queue.sync { teardown() }
                        logger.warning("DNS-SD session lost; registering again", metadata: ["reason": "\(reason)"])
                        warned = true
                        eventSink.yield(.unavailable(reason: reason))
                        waitingForRetry = true
                        scheduleRetry()
                    }
                }
                break session
            }
            retryTask?.cancel()
            queue.sync { teardown() }
            firstOutcome.set(.unavailable(reason: "stopped"))
            eventSink.finish()
        } onGracefulShutdown: {
            self.markShutdown()
            self.signalSink.yield(.shutdown)
        }
    }

    private let shutdownFlag = ShutdownFlag()
    var isShuttingDown: Bool { shutdownFlag.isSet }
    func markShutdown() { shutdownFlag.set() }

    // MARK: session (on queue)

    /// Registers and browses; returns a reason when avahi is unreachable.
    func startSession() -> String? {
        dispatchPrecondition(condition: .onQueue(queue))
        if isShuttingDown { return nil }
        if let ad = currentAdvertisement {
            var txt = TXTRecordRef()
            TXTRecordCreate(&txt, 0, nil)
            defer { TXTRecordDeallocate(&txt) }
            for (key, value) in ad.txt.sorted(by: { $0.key < $1.key }) {
                let bytes = Array(value.utf8)
                _ = TXTRecordSetValue(&txt, key, UInt8(bytes.count), bytes)
            }
            var ref: DNSServiceRef?
            let err = DNSServiceRegister(
                &ref, 0, 0, ad.instanceName, Advertisement.serviceType, nil, nil, UInt16(ad.port).bigEndian,
                TXTRecordGetLength(&txt), TXTRecordGetBytesPtr(&txt), registerReply, Unmanaged.passUnretained(self).toOpaque())
            guard err == kDNSServiceErr_NoError, let ref else { return "DNSServiceRegister failed: \(describe(err))" }
            registration = DNSSDHandle(ref: ref, queue: queue, owner: self)
        }
        var ref: DNSServiceRef?
        let err = DNSServiceBrowse(&ref, 0, 0, Advertisement.serviceType, nil, browseReply, Unmanaged.passUnretained(self).toOpaque())
        guard err == kDNSServiceErr_NoError, let ref else {
            teardown()
            return "DNSServiceBrowse failed: \(describe(err))"
        }
        browse = DNSSDHandle(ref: ref, queue: queue, owner: self)
        sessionAlive = true
        return nil
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
        guard sessionAlive else { return }
        sessionAlive = false
        signalSink.yield(.failed(reason))
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
        if added {
            if let lookup = lookups[instance] {
                lookup.interfaces += 1
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

/// One dns_sd handle driven by a DispatchSource on its socket, deallocated after the
/// source is cancelled (the order Avahi needs).
final class DNSSDHandle {
    let ref: DNSServiceRef
    let source: DispatchSourceRead

    init(ref: DNSServiceRef, queue: DispatchQueue, owner: DNSSDDiscovery) {
        self.ref = ref
        source = DispatchSource.makeReadSource(fileDescriptor: DNSServiceRefSockFD(ref), queue: queue)
        source.setEventHandler { [weak owner] in
            let err = DNSServiceProcessResult(ref)
            if err != kDNSServiceErr_NoError { owner?.sessionFailed("process result: \(describe(err))") }
        }
        source.setCancelHandler { DNSServiceRefDeallocate(ref) }
        source.resume()
    }

    func cancel() { source.cancel() }
}

/// Resolves one browsed instance (host, port, TXT), then follows its A records.
final class PeerLookup {
    let instance: String
    let domain: String
    let interface: UInt32
    unowned let owner: DNSSDDiscovery
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
        var ref: DNSServiceRef?
        let err = DNSServiceResolve(
            &ref, 0, interface, instance, Advertisement.serviceType, domain, resolveReply, Unmanaged.passUnretained(self).toOpaque())
        guard err == kDNSServiceErr_NoError, let ref else {
            owner.logger.debug("resolve failed", metadata: ["instance": "\(LogText.escape(instance))", "error": "\(describe(err))"])
            return
        }
        resolveHandle = DNSSDHandle(ref: ref, queue: owner.queue, owner: owner)
    }

    func resolved(host: String, port: Int, txt: [String: String]) {
        resolveHandle?.cancel()
        resolveHandle = nil
        guard let id = txt["id"].flatMap(NodeIDFormat.normalized) else {
            owner.logger.debug("a _ferry._tcp service without a valid id TXT key", metadata: ["instance": "\(LogText.escape(instance))"])
            return
        }
        peer = DiscoveredPeer(
            instance: instance, nodeID: id, group: txt["group"] ?? "", protocolVersion: Int(txt["proto"] ?? "") ?? 0,
            host: host, addresses: [], port: port, source: .dnsSD)
        // A records only: Avahi's AAAA answers can be link-local without a scope.
        var ref: DNSServiceRef?
        let err = DNSServiceQueryRecord(
            &ref, 0, interface, host, UInt16(kDNSServiceType_A), UInt16(kDNSServiceClass_IN), queryReply,
            Unmanaged.passUnretained(self).toOpaque())
        guard err == kDNSServiceErr_NoError, let ref else {
            owner.logger.debug("A-record query failed", metadata: ["host": "\(LogText.escape(host))", "error": "\(describe(err))"])
            return
        }
        queryHandle = DNSSDHandle(ref: ref, queue: owner.queue, owner: owner)
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
        owner.found(peer, lookup: self)
    }

    func cancel() {
        resolveHandle?.cancel()
        resolveHandle = nil
        queryHandle?.cancel()
        queryHandle = nil
    }
}

// MARK: C callbacks (no captures allowed; the context pointer carries the owner)

private let registerReply: DNSServiceRegisterReply = { _, _, error, name, _, _, context in
    let owner = Unmanaged<DNSSDDiscovery>.fromOpaque(context!).takeUnretainedValue()
    owner.registered(name: name.map { String(cString: $0) } ?? "?", error: error)
}

private let browseReply: DNSServiceBrowseReply = { _, flags, interface, error, name, _, domain, context in
    let owner = Unmanaged<DNSSDDiscovery>.fromOpaque(context!).takeUnretainedValue()
    owner.browsed(
        instance: name.map { String(cString: $0) } ?? "", domain: domain.map { String(cString: $0) } ?? "local.",
        interface: interface, added: flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0, error: error)
}

private let resolveReply: DNSServiceResolveReply = { _, _, _, error, _, host, port, txtLength, txtBytes, context in
    let lookup = Unmanaged<PeerLookup>.fromOpaque(context!).takeUnretainedValue()
    guard error == kDNSServiceErr_NoError, let host else { return }
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
    let lookup = Unmanaged<PeerLookup>.fromOpaque(context!).takeUnretainedValue()
    guard error == kDNSServiceErr_NoError, type == UInt16(kDNSServiceType_A), length == 4, let data else { return }
    let b = data.assumingMemoryBound(to: UInt8.self)
    lookup.address("\(b[0]).\(b[1]).\(b[2]).\(b[3])", added: flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0)
}

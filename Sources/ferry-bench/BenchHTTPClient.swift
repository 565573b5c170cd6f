import FerryCore
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// A minimal keep-alive HTTP/1.1 client for the benchmarks' calls to admin and REST APIs
/// on loopback: this machine's, or a LAN-lab host's (its network namespace).
///
/// Hand-rolled on NIOHTTP1 because what the latency figures time must be the node, not
/// the client: Foundation's URLSession on Linux added about 6 ms to each long-poll here
/// (measured: a write seen on the writer's own feed took 7 ms through URLSession, 1.1 ms
/// through a plain keep-alive client), and async-http-client would add nio-http2 and
/// more to every build of the package for one benchmark.
final class BenchHTTPClient: Sendable {
    static let shared = BenchHTTPClient()

    /// One reply: status and body.
    struct Reply: Sendable {
        let status: Int
        let body: [UInt8]
    }

    private let group = MultiThreadedEventLoopGroup.singleton
    /// Idle keep-alive connections by "host:port".
    private let idle = Locked<[String: [Channel]]>([:])

    func request(
        _ method: String, _ url: String, headers: [(String, String)] = [], body: [UInt8]? = nil, timeout: Duration = .seconds(60),
        namespace: NetworkNamespace? = nil
    ) async throws -> Reply {
        guard let u = URL(string: url), let host = u.host, let port = u.port else { throw BenchError("bad URL \(url)") }
        let key = "\(namespace.map { "\($0.holderPID)/" } ?? "")\(host):\(port)"
        let channel = try await takeConnection(key: key, host: host, port: port, namespace: namespace)
        var path = u.path.isEmpty ? "/" : u.path
        if let q = u.query { path += "?" + q }
        var head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: method), uri: path)
        head.headers.add(name: "Host", value: "\(host):\(port)")
        head.headers.add(name: "Content-Length", value: "\(body?.count ?? 0)")
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        let promise = channel.eventLoop.makePromise(of: Reply.self)
        let handler = try await channel.pipeline.handler(type: ResponseCollector.self).get()
        channel.eventLoop.execute { handler.expect(promise) }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        if let body, !body.isEmpty {
            channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil)
        }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        let timer = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(timeout.components.seconds) * 1_000_000_000)) {
            promise.fail(BenchError("\(method) \(url) timed out"))
            channel.close(promise: nil)
        }
        do {
            let reply = try await promise.futureResult.get()
            timer.cancel()
            idle.withLock { $0[key, default: []].append(channel) }
            return reply
        } catch {
            timer.cancel()
            channel.close(promise: nil)
            throw error
        }
    }

    private func takeConnection(key: String, host: String, port: Int, namespace: NetworkNamespace?) async throws -> Channel {
        while let channel = idle.withLock({ $0[key]?.popLast() }) {
            if channel.isActive { return channel }
        }
        let bootstrap = ClientBootstrap(group: group)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.pipeline.addHTTPClientHandlers().flatMap { channel.pipeline.addHandler(ResponseCollector()) }
            }
        guard let namespace else { return try await bootstrap.connect(host: host, port: port).get() }
        let socket = try await namespace.connectedSocket(ipv4: host, port: port)
        return try await bootstrap.withConnectedSocket(socket).get()
    }
}

/// Gathers one HTTP response at a time into the promise of the request that awaits it.
private final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
    // @unchecked: a channel handler; NIO calls it only on its channel's event loop.
    typealias InboundIn = HTTPClientResponsePart
    private var promise: EventLoopPromise<BenchHTTPClient.Reply>?
    private var status = 0
    private var body: [UInt8] = []

    func expect(_ promise: EventLoopPromise<BenchHTTPClient.Reply>) {
        self.promise = promise
        status = 0
        body = []
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): status = Int(head.status.code)
        case .body(var buffer): body += buffer.readBytes(length: buffer.readableBytes) ?? []
        case .end:
            promise?.succeed(.init(status: status, body: body))
            promise = nil
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise?.fail(BenchError("the connection closed before the reply"))
        promise = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        promise?.fail(error)
        promise = nil
        context.close(promise: nil)
    }
}

/// A LAN-lab host's network namespace, entered through its holder process: sockets made
/// there reach the host's own loopback (where a node's admin API listens) for their life.
struct NetworkNamespace: Sendable {
    let holderPID: Int32

    private typealias SetNS = @convention(c) (Int32, Int32) -> Int32
    /// Glibc's setns(2), which Swift's Glibc module does not export.
    private static let setns: SetNS? = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "setns")
        .map { unsafeBitCast($0, to: SetNS.self) }
    private static let newNet: Int32 = 0x4000_0000  // CLONE_NEWNET

    /// A TCP socket connected to `ipv4:port` inside the namespace. setns(2) moves only the
    /// calling thread, so the socket is made on a thread of its own that then exits.
    func connectedSocket(ipv4: String, port: Int) async throws -> Int32 {
        let pid = holderPID
        return try await withCheckedThrowingContinuation { (c: CheckedContinuation<Int32, any Error>) in
            let thread = Thread { c.resume(with: Result { try Self.connect(inNamespaceOf: pid, ipv4: ipv4, port: port) }) }
            thread.start()
        }
    }

    private static func connect(inNamespaceOf pid: Int32, ipv4: String, port: Int) throws -> Int32 {
        guard let setns else { throw BenchError("setns(2) is not available") }
        let target = open("/proc/\(pid)/ns/net", O_RDONLY)
        let own = open("/proc/thread-self/ns/net", O_RDONLY)
        defer {
            if own >= 0 { _ = setns(own, newNet) }
            close(target)
            close(own)
        }
        guard target >= 0, own >= 0, setns(target, newNet) == 0 else {
            throw BenchError("cannot enter the network namespace of pid \(pid): errno \(errno)")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BenchError("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, ipv4, &address.sin_addr)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else {
            let e = errno
            close(fd)
            throw BenchError("connect to \(ipv4):\(port) in pid \(pid)'s namespace: errno \(e)")
        }
        return fd
    }
}

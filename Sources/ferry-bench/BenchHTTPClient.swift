import FerryCore
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// A minimal keep-alive HTTP/1.1 client for the benchmarks' calls to admin and REST APIs
/// on loopback.
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
    private let idle = Mutex<[String: [Channel]]>([:])

    func request(
        _ method: String, _ url: String, headers: [(String, String)] = [], body: [UInt8]? = nil, timeout: Duration = .seconds(60)
    ) async throws -> Reply {
        guard let u = URL(string: url), let host = u.host, let port = u.port else { throw BenchError("bad URL \(url)") }
        let key = "\(host):\(port)"
        let channel = try await takeConnection(key: key, host: host, port: port)
        var path = u.path.isEmpty ? "/" : u.path
        if let q = u.query { path += "?" + q }
        var head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: method), uri: path)
        head.headers.add(name: "Host", value: key)
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

    private func takeConnection(key: String, host: String, port: Int) async throws -> Channel {
        while let channel = idle.withLock({ $0[key]?.popLast() }) {
            if channel.isActive { return channel }
        }
        return try await ClientBootstrap(group: group)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.pipeline.addHTTPClientHandlers().flatMap { channel.pipeline.addHandler(ResponseCollector()) }
            }
            .connect(host: host, port: port).get()
    }
}

/// Gathers one HTTP response at a time into the promise of the request that awaits it.
private final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
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

import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle

/// Refuses, before routing, every request that does not come from a local client holding
/// the admin key: a foreign `Host` (DNS rebinding), an unlisted `Origin` (a web page), a
/// missing or wrong key, and a body that is not JSON (what an HTML form can send).
struct AdminGuard<Context: RequestContext>: RouterMiddleware {
    let key: AdminKey
    let allowedOrigins: Set<String>
    let publicMetrics: Bool

    init(key: AdminKey, allowedOrigins: [String], publicMetrics: Bool) {
        self.key = key
        self.allowedOrigins = Set(allowedOrigins.map(AdminRequestRules.normalizedOrigin))
        self.publicMetrics = publicMetrics
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        typealias Rules = AdminRequestRules
        // The authority is the first `Host` (or an absolute-form target's, which
        // `RequestTargetHandler` puts first). Every `Host` must be loopback, since whatever
        // sits in front of the node may read another one, and all must agree.
        let headerHosts = request.headers.filter { $0.name.canonicalName == "host" }.map(\.value)
        for host in [request.head.authority] + headerHosts.map(Optional.some) {
            guard let host, Rules.isLoopbackAuthority(host) else {
                throw APIError(
                    .misdirectedRequest, "misdirected",
                    "the admin API answers only requests addressed to a loopback host (127.0.0.1, ::1 or localhost), not \(LogText.escape(host ?? "no Host"))")
            }
        }
        let authorities = [request.head.authority ?? ""] + headerHosts
        if Set(authorities.map { $0.lowercased() }).count > 1 {
            throw APIError(
                .misdirectedRequest, "misdirected",
                "the request names more than one authority (\(LogText.escape(authorities.joined(separator: ", "))))")
        }
        for origin in request.headers[values: .origin] where !allowedOrigins.contains(Rules.normalizedOrigin(origin)) {
            throw APIError(.forbidden, "forbidden_origin", "requests from the web origin \(origin) are refused (see admin.allowedOrigins)")
        }
        let open = publicMetrics && request.method == .get && request.uri.path == "/metrics"
        if !open {
            guard let presented = Rules.bearerToken(request.headers[.authorization]), key.matches(presented) else {
                throw APIError(.unauthorized, "unauthorized", "send the node's admin key (DATA/admin.key) as Authorization: Bearer KEY")
            }
        }
        if Rules.carriesBody(request), !Rules.isJSON(request.headers[.contentType]) {
            throw APIError(
                .unsupportedMediaType, "unsupported_media_type",
                "request bodies must be Content-Type: application/json, not \(request.headers[.contentType] ?? "none")")
        }
        return try await next(request, context)
    }
}

/// The checks AdminGuard applies, as pure functions of header values.
enum AdminRequestRules {
    /// Whether an authority is exactly `host`, `host:port`, `[v6]` or `[v6]:port` (port
    /// 1–65535 in digits) with the host `localhost`, in 127.0.0.0/8 or ::1.
    static func isLoopbackAuthority(_ authority: String) -> Bool {
        var host = Substring(authority)
        var port: Substring?
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.first == ":" else { return false }
                port = rest.dropFirst()
            }
        } else if let colon = host.firstIndex(of: ":") {
            port = host[host.index(after: colon)...]
            host = host[..<colon]
        }
        if let port {
            guard !port.isEmpty, port.count <= 5, port.allSatisfy({ $0.isASCII && $0.isNumber }),
                let n = Int(port), (1...65535).contains(n)
            else { return false }
        }
        let name = host.lowercased()
        if name == "localhost" || name == "localhost." { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, name, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        var loopback = in6_addr()
        _ = inet_pton(AF_INET6, "::1", &loopback)
        return inet_pton(AF_INET6, name, &v6) == 1 && withUnsafeBytes(of: v6, { Array($0) }) == withUnsafeBytes(of: loopback, { Array($0) })
    }

    /// The authority a request target names: an absolute-form target's
    /// (`http://HOST:PORT/path`) or an authority-form one's (`HOST:PORT`); nil for
    /// origin-form (`/path`) and `*`.
    static func targetAuthority(_ target: String) -> Substring? {
        if target.hasPrefix("/") || target == "*" { return nil }
        var rest = Substring(target)
        if let scheme = rest.range(of: "://") { rest = rest[scheme.upperBound...] }
        return rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    }

    /// The token of `Bearer TOKEN` (scheme case-insensitive), else nil.
    static func bearerToken(_ header: String?) -> Substring? {
        guard let header, let space = header.firstIndex(of: " "), header[..<space].lowercased() == "bearer" else { return nil }
        let token = header[space...].drop { $0 == " " }
        return token.isEmpty ? nil : token
    }

    static func normalizedOrigin(_ origin: String) -> String {
        var o = origin.trimmingCharacters(in: .whitespaces).lowercased()
        while o.hasSuffix("/") { o.removeLast() }
        return o
    }

    /// POST and PUT always carry a body; other methods when they say so.
    static func carriesBody(_ request: Request) -> Bool {
        if request.method == .post || request.method == .put || request.method == .patch { return true }
        if request.headers[.transferEncoding] != nil { return true }
        if let length = request.headers[.contentLength], length != "0" { return true }
        return false
    }

    /// `application/json`, with or without parameters such as `charset=utf-8`.
    static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return false }
        let media = contentType.split(separator: ";", maxSplits: 1).first ?? ""
        return media.trimmingCharacters(in: .whitespaces).lowercased() == "application/json"
    }
}

/// Hummingbird's HTTP/1 channel with `RequestTargetHandler` ahead of its conversion to
/// HTTP types, which would otherwise drop an absolute-form target's authority.
struct AdminHTTP1Channel: HTTPChannelHandler {
    typealias Value = HTTP1Channel.Value
    let inner: HTTP1Channel
    var responder: Responder { inner.responder }

    init(responder: @escaping Responder) { inner = HTTP1Channel(responder: responder) }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        inner.setup(channel: channel, logger: logger).flatMapThrowing { value in
            let decoder = try channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
            try channel.pipeline.syncOperations.addHandler(RequestTargetHandler(), position: .after(decoder))
            return value
        }
    }

    func handle(value: Value, logger: Logger) async { await inner.handle(value: value, logger: logger) }
}

/// Makes a request target's authority the request's: for an absolute-form or
/// authority-form target it adds that authority as the first `Host` (keeping the client's,
/// which `AdminGuard` then requires to agree), as HTTP/1.1 has the target win over `Host`.
final class RequestTargetHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var head) = unwrapInboundIn(data), let authority = AdminRequestRules.targetAuthority(head.uri) else {
            context.fireChannelRead(data)
            return
        }
        var headers = HTTPHeaders([("Host", String(authority))])
        headers.add(contentsOf: head.headers)
        head.headers = headers
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }
}

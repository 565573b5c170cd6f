import FerryCore
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1

/// The checks a node's HTTP APIs (admin and CouchDB) apply to requests, as pure functions
/// of header values, so both listeners refuse the same things the same way.
public enum HTTPRequestRules {
    /// Whether an authority is exactly `host`, `host:port`, `[v6]` or `[v6]:port` (port
    /// 1–65535 in digits) with the host `localhost`, in 127.0.0.0/8 or ::1.
    public static func isLoopbackAuthority(_ authority: String) -> Bool {
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

    /// Why a request's authorities are refused on a loopback-only listener, or nil when
    /// every one is loopback and they all agree. The authority is the first `Host` (or an
    /// absolute-form target's, which `RequestTargetHandler` puts first); every `Host` must be
    /// loopback, since whatever sits in front of the node may read another one.
    public static func loopbackAuthorityProblem(_ request: Request) -> String? {
        let headerHosts = request.headers.filter { $0.name.canonicalName == "host" }.map(\.value)
        for host in [request.head.authority] + headerHosts.map(Optional.some) {
            guard let host, isLoopbackAuthority(host) else {
                return "requests must be addressed to a loopback host (127.0.0.1, ::1 or localhost), not \(LogText.escape(host ?? "no Host"))"
            }
        }
        let authorities = [request.head.authority ?? ""] + headerHosts
        if Set(authorities.map { $0.lowercased() }).count > 1 {
            return "the request names more than one authority (\(LogText.escape(authorities.joined(separator: ", "))))"
        }
        return nil
    }

    /// The authority a request target names: an absolute-form target's
    /// (`http://HOST:PORT/path`) or an authority-form one's (`HOST:PORT`); nil for
    /// origin-form (`/path`) and `*`.
    public static func targetAuthority(_ target: String) -> Substring? {
        if target.hasPrefix("/") || target == "*" { return nil }
        var rest = Substring(target)
        if let scheme = rest.range(of: "://") { rest = rest[scheme.upperBound...] }
        return rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    }

    /// The token of `Bearer TOKEN` (scheme case-insensitive), else nil.
    public static func bearerToken(_ header: String?) -> Substring? {
        guard let header, let space = header.firstIndex(of: " "), header[..<space].lowercased() == "bearer" else { return nil }
        let token = header[space...].drop { $0 == " " }
        return token.isEmpty ? nil : token
    }

    /// The user and password of `Basic BASE64(user:password)` (scheme case-insensitive);
    /// nil for another scheme, bad base64, or no colon.
    public static func basicCredentials(_ header: String?) -> (user: String, password: String)? {
        guard let header, let space = header.firstIndex(of: " "), header[..<space].lowercased() == "basic" else { return nil }
        let encoded = header[space...].trimmingCharacters(in: .whitespaces)
        guard let data = Data(base64Encoded: encoded), let text = String(data: data, encoding: .utf8),
            let colon = text.firstIndex(of: ":")
        else { return nil }
        return (String(text[..<colon]), String(text[text.index(after: colon)...]))
    }

    /// The admin key a request presents: a Bearer token, or the password of HTTP Basic with
    /// the user `admin`; nil when it presents neither.
    public static func presentedAdminKey(_ header: String?) -> String? {
        if let token = bearerToken(header) { return String(token) }
        if let basic = basicCredentials(header), basic.user == "admin" { return basic.password }
        return nil
    }

    public static func normalizedOrigin(_ origin: String) -> String {
        var o = origin.trimmingCharacters(in: .whitespaces).lowercased()
        while o.hasSuffix("/") { o.removeLast() }
        return o
    }

    /// POST and PUT always carry a body; other methods when they say so.
    public static func carriesBody(_ request: Request) -> Bool {
        if request.method == .post || request.method == .put || request.method == .patch { return true }
        if request.headers[.transferEncoding] != nil { return true }
        if let length = request.headers[.contentLength], length != "0" { return true }
        return false
    }

    /// `application/json`, with or without parameters such as `charset=utf-8`.
    public static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return false }
        let media = contentType.split(separator: ";", maxSplits: 1).first ?? ""
        return media.trimmingCharacters(in: .whitespaces).lowercased() == "application/json"
    }
}

/// Hummingbird's HTTP/1 channel with `RequestTargetHandler` ahead of its conversion to
/// HTTP types, which would otherwise drop an absolute-form target's authority.
public struct AuthorityHTTP1Channel: HTTPChannelHandler {
    public typealias Value = HTTP1Channel.Value
    let inner: HTTP1Channel
    public var responder: Responder { inner.responder }

    public init(responder: @escaping Responder, configuration: HTTP1Channel.Configuration = .init()) {
        inner = HTTP1Channel(responder: responder, configuration: configuration)
    }

    public func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        inner.setup(channel: channel, logger: logger).flatMapThrowing { value in
            let decoder = try channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
            try channel.pipeline.syncOperations.addHandler(RequestTargetHandler(), position: .after(decoder))
            return value
        }
    }

    public func handle(value: Value, logger: Logger) async { await inner.handle(value: value, logger: logger) }
}

/// Makes a request target's authority the request's: for an absolute-form or
/// authority-form target it adds that authority as the first `Host` (keeping the client's,
/// which the loopback check then requires to agree), as HTTP/1.1 has the target win over `Host`.
public final class RequestTargetHandler: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = HTTPServerRequestPart
    public typealias InboundOut = HTTPServerRequestPart

    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var head) = unwrapInboundIn(data), let authority = HTTPRequestRules.targetAuthority(head.uri) else {
            context.fireChannelRead(data)
            return
        }
        var headers = HTTPHeaders([("Host", String(authority))])
        headers.add(contentsOf: head.headers)
        head.headers = headers
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }
}

import FerryCouchDocuments
import Foundation
import Hummingbird

/// Which web origins may call the CouchDB API from a browser: the exact origins listed, and
/// with `*` any other origin but only without credentials (a web page must not drive the
/// node with a user's cookie or the admin key).
public struct CouchCORSPolicy: Sendable, Equatable {
    /// Normalised (`scheme://host[:port]`, lower case, no trailing `/`).
    public let origins: Set<String>
    public let anyOriginWithoutCredentials: Bool

    public init(origins: [String]) {
        anyOriginWithoutCredentials = origins.contains("*")
        self.origins = Set(origins.filter { $0 != "*" }.map(HTTPRequestRules.normalizedOrigin))
    }

    /// What a request's `Origin` header earns it.
    public enum Decision: Equatable, Sendable {
        /// No `Origin`: not a cross-origin browser request.
        case noOrigin
        /// Answer with CORS headers for `origin`; `credentials` for listed origins.
        case allowed(origin: String, credentials: Bool)
        case refused(reason: String)
    }

    public func decide(origin: String?, carriesCredentials: Bool) -> Decision {
        guard let origin else { return .noOrigin }
        if origins.contains(HTTPRequestRules.normalizedOrigin(origin)) { return .allowed(origin: origin, credentials: true) }
        if anyOriginWithoutCredentials {
            if !carriesCredentials { return .allowed(origin: "*", credentials: false) }
            return .refused(reason: "requests with credentials from the web origin \(origin) are refused: only origins listed in couch.cors.origins may send them")
        }
        return .refused(reason: "requests from the web origin \(origin) are refused (see couch.cors.origins)")
    }

    static let allowedMethods = "GET, HEAD, POST, PUT, DELETE, COPY, OPTIONS"
    static let allowedHeaders: Set<String> = [
        "accept", "accept-language", "authorization", "content-type", "content-length", "destination", "if-match",
        "if-none-match", "origin", "referer", "x-csrf-token", "x-requested-with",
    ]
    static let exposedHeaders = "content-type, cache-control, accept-ranges, etag, server, x-couch-request-id, x-couch-update-newrev, x-couchdb-body-time"

    /// Headers for a response to an allowed cross-origin request.
    public func responseHeaders(origin: String, credentials: Bool) -> HTTPFields {
        var h = HTTPFields()
        h[.accessControlAllowOrigin] = origin
        if credentials { h[.accessControlAllowCredentials] = "true" }
        h[.accessControlExposeHeaders] = Self.exposedHeaders
        h[.vary] = "Origin"
        return h
    }

    /// The answer to a preflight (`OPTIONS` with `Access-Control-Request-Method`): 204 with
    /// what may be sent, or a refusal naming the header or method that may not.
    public func preflight(origin: String, credentials: Bool, method: String, headers requested: String?) -> Result<HTTPFields, CouchError> {
        let m = method.trimmingCharacters(in: .whitespaces).uppercased()
        guard Self.allowedMethods.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).contains(m) else {
            return .failure(.forbidden("the method \(m) is not allowed across origins"))
        }
        let asked = (requested ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        if let bad = asked.first(where: { !Self.allowedHeaders.contains($0) }) {
            return .failure(.forbidden("the header \(bad) is not allowed across origins"))
        }
        var h = responseHeaders(origin: origin, credentials: credentials)
        h[.accessControlAllowMethods] = Self.allowedMethods
        h[.accessControlAllowHeaders] = Self.allowedHeaders.sorted().joined(separator: ", ")
        h[.accessControlMaxAge] = "600"
        return .success(h)
    }
}

import FerryCore
import HTTPTypes

/// An error in CouchDB's shape: `{"error": …, "reason": …}` with CouchDB's status.
public struct CouchError: FerryError, Equatable {
    public let status: HTTPResponse.Status
    public let error: String
    public let reason: String

    public init(_ status: HTTPResponse.Status, _ error: String, _ reason: String) {
        self.status = status
        self.error = error
        self.reason = reason
    }

    public static func badRequest(_ reason: String) -> CouchError { .init(.badRequest, "bad_request", reason) }
    public static func notFound(_ reason: String = "missing") -> CouchError { .init(.notFound, "not_found", reason) }
    public static func conflict(_ reason: String = "Document update conflict.") -> CouchError {
        .init(.conflict, "conflict", reason)
    }
    public static func unauthorized(_ reason: String) -> CouchError { .init(.unauthorized, "unauthorized", reason) }
    public static func forbidden(_ reason: String) -> CouchError { .init(.forbidden, "forbidden", reason) }
    public static func tooLarge(_ reason: String) -> CouchError { .init(.contentTooLarge, "too_large", reason) }
    public static func unsupportedMediaType(_ reason: String) -> CouchError {
        .init(.unsupportedMediaType, "bad_content_type", reason)
    }
    public static func methodNotAllowed(_ allowed: String) -> CouchError {
        .init(.methodNotAllowed, "method_not_allowed", "Only \(allowed) allowed")
    }

    public var domain: String { "couch" }
    public var code: String { error }
    public var failure: FailureKind {
        switch status.code {
        case 401, 403: .forbidden
        case 404: .notFound
        case 409, 412: .conflict
        case 413: .tooLarge
        case 429: .rateLimited
        case 503: .unavailable
        case 500...: .internalFailure
        default: .invalidRequest
        }
    }
    public var isTransient: Bool { status.code >= 500 || status == .tooManyRequests }
    public var description: String { "\(error): \(reason)" }
}

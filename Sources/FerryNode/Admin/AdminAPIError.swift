import FerryCore
import Hummingbird
import Logging
import NIOCore

/// An admin API error: it knows its HTTP status and answers `{"error": code, "reason": text}`.
struct APIError: HTTPResponseError, Sendable {
    let status: HTTPResponse.Status
    let code: String
    let reason: String

    init(_ status: HTTPResponse.Status, _ code: String, _ reason: String) {
        self.status = status
        self.code = code
        self.reason = reason
    }

    /// A Ferry error (mostly the store's) under its own code, with the status of its kind of
    /// failure (`FailureKind`, shared with the CouchDB API; docs/operations.md lists them).
    init(_ error: any FerryError) {
        self.init(HTTPResponse.Status(code: error.failure.httpStatus), error.code, error.description)
    }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var response = json(["error": .string(code), "reason": .string(reason)], status: status)
        if status == .unauthorized { response.headers[.wwwAuthenticate] = #"Bearer realm="ferry""# }
        return response
    }
}

/// Turns every error that is not yet an `APIError` (store errors, unknown routes, failures)
/// into one, so clients never see an empty or HTML body; logs those that are the node's fault.
struct APIErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let e as APIError {
            throw e
        } catch let e as any FerryError {
            let error = APIError(e)
            if error.status == .internalServerError { logger.error("admin API request failed", metadata: ["error": "\(e)"]) }
            throw error
        } catch let e as HTTPError where e.status == .notFound {
            throw APIError(.notFound, "not_found", "no route \(request.method) \(request.uri.path)")
        } catch let e as any HTTPResponseError {
            throw APIError(e.status, "http_error", (e as? HTTPError)?.body ?? "\(e.status)")
        } catch {
            logger.error("admin API request failed", metadata: ["error": "\(error)"])
            throw APIError(.internalServerError, "internal", "\(error)")
        }
    }
}

import FerryCore
import FerryCouchDocuments
import Foundation
import Hummingbird

/// The options of one CouchDB request, from its query string and (for POST endpoints that
/// take them there) its JSON body, read as typed values; a malformed one is a 400 naming it.
struct CouchParameters {
    private var query: [String: String] = [:]
    private var body: [String: JSON] = [:]

    /// The query string's options; a repeated name keeps its last value, as CouchDB does.
    init(_ request: Request) {
        for (key, value) in request.uri.queryParameters {
            query[String(key.removingPercentEncoding ?? String(key))] = String(value)
        }
    }

    /// Options a JSON request body also carries (`_all_docs`, `_changes`): the body's wins.
    mutating func merge(body fields: [String: JSON]) {
        for (key, value) in fields { body[key] = value }
    }

    /// The option as text: the query string's value, or a body value (a JSON string's
    /// contents, anything else in its JSON form).
    func string(_ name: String) -> String? {
        if let v = body[name] {
            if let s = v.stringValue { return s }
            return v.canonicalString
        }
        return query[name]
    }

    func bool(_ name: String, default value: Bool = false) throws(CouchError) -> Bool {
        if let v = body[name] {
            guard let b = v.boolValue else { throw Self.invalid(name, v.canonicalString, "a boolean") }
            return b
        }
        guard let text = query[name] else { return value }
        switch text {
        case "true": return true
        case "false": return false
        default: throw Self.invalid(name, text, "a boolean (true or false)")
        }
    }

    /// A non-negative integer option.
    func count(_ name: String) throws(CouchError) -> Int? {
        if let v = body[name] {
            guard let n = v.intValue, n >= 0 else { throw Self.invalid(name, v.canonicalString, "a non-negative integer") }
            return Int(clamping: n)
        }
        guard let text = query[name] else { return nil }
        guard let n = Int(text), n >= 0 else { throw Self.invalid(name, text, "a non-negative integer") }
        return n
    }

    /// A JSON-encoded option (`startkey`, `keys`, `doc_ids`): its parsed value.
    func json(_ name: String) throws(CouchError) -> JSON? {
        if let v = body[name] { return v }
        guard let text = query[name] else { return nil }
        do throws(JSONParseError) {
            return try JSON.parse(Array(text.utf8))
        } catch {
            throw CouchError.badRequest("Query parameter `\(name)` must be JSON, not \"\(text)\": \(error.reason).")
        }
    }

    /// One of a fixed set of words.
    func choice(_ name: String, _ allowed: [String]) throws(CouchError) -> String? {
        guard let text = string(name) else { return nil }
        guard allowed.contains(text) else {
            throw Self.invalid(name, text, "one of " + allowed.joined(separator: ", "))
        }
        return text
    }

    static func invalid(_ name: String, _ value: String, _ expected: String) -> CouchError {
        .badRequest("Query parameter `\(name)` must be \(expected), not \"\(value)\".")
    }
}

extension CouchDatabase {
    /// The JSON object body of a POST, or an empty object for an empty body; anything else is 400.
    func readOptionalObject(_ request: Request) async throws -> [String: JSON] {
        let buffer = try await readBody(request)
        if buffer.readableBytes == 0 { return [:] }
        let value = try Self.parseJSON(buffer.readableBytesView)
        guard let fields = value.objectValue else { throw CouchError.badRequest("Request body must be a JSON object") }
        return fields
    }
}

import FerryCore
import Foundation

/// MIME multipart bodies as CouchDB's replicator sends and reads them (`multipart/related`
/// for one document with its attachments, `multipart/mixed` for `open_revs`).
///
/// Hand-rolled: none of the project's libraries parses MIME, and CouchDB uses only a small
/// part of it (a boundary, a few headers per part, no nesting on input). Sizes are capped
/// and anything malformed is refused with 400.
package enum Multipart {
    /// One part: its headers (names lowercased) and its bytes.
    package struct Part {
        package var headers: [String: String]
        package var body: [UInt8]
    }

    package static let maxParts = 10_000
    package static let maxHeaderBytes = 16 << 10

    /// The `boundary` parameter of a `multipart/…` content type.
    package static func boundary(of contentType: String) -> String? {
        for param in contentType.split(separator: ";").dropFirst() {
            let kv = param.split(separator: "=", maxSplits: 1)
            guard kv.count == 2, kv[0].trimmingCharacters(in: .whitespaces).lowercased() == "boundary" else { continue }
            var value = kv[1].trimmingCharacters(in: .whitespaces)
            if value.hasPrefix("\"") && value.hasSuffix("\"") && value.count >= 2 { value = String(value.dropFirst().dropLast()) }
            guard !value.isEmpty, value.utf8.count <= 70 else { return nil }
            return value
        }
        return nil
    }

    /// The media type of a content type, lowercased, without parameters.
    package static func mediaType(_ contentType: String?) -> String {
        guard let contentType else { return "" }
        return contentType.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? ""
    }

    /// Splits `bytes` into its parts.
    package static func parse(_ bytes: [UInt8], boundary: String) throws(CouchError) -> [Part] {
        let delimiter = Array(("--" + boundary).utf8)
        guard var cursor = find(delimiter, in: bytes, from: 0) else {
            throw .badRequest("multipart body has no boundary \(boundary)")
        }
        var parts: [Part] = []
        while true {
            cursor += delimiter.count
            if bytes.count >= cursor + 2 && bytes[cursor] == 0x2D && bytes[cursor + 1] == 0x2D { break }  // closing "--"
            cursor = skipLineEnd(bytes, cursor)
            let crlf: [UInt8] = [0x0D, 0x0A]
            let headerEnd: Int
            let bodyStart: Int
            if bytes.count >= cursor + 2 && Array(bytes[cursor..<cursor + 2]) == crlf {
                headerEnd = cursor
                bodyStart = cursor + 2
            } else if let e = find(crlf + crlf, in: bytes, from: cursor) {
                headerEnd = e
                bodyStart = e + 4
            } else {
                throw .badRequest("multipart part without a header block")
            }
            guard headerEnd - cursor <= maxHeaderBytes else { throw .badRequest("multipart part headers are too long") }
            var headers: [String: String] = [:]
            let headerText = String(decoding: bytes[cursor..<headerEnd], as: UTF8.self)
            for line in headerText.components(separatedBy: "\r\n") where !line.isEmpty {
                guard let colon = line.firstIndex(of: ":") else { throw .badRequest("malformed multipart header: \(line)") }
                headers[line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()] =
                    line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            guard let end = find(crlf + delimiter, in: bytes, from: bodyStart) else {
                throw .badRequest("multipart body is not closed by --\(boundary)--")
            }
            let next = end
            parts.append(Part(headers: headers, body: Array(bytes[bodyStart..<end])))
            guard parts.count <= maxParts else { throw .badRequest("multipart body has too many parts") }
            cursor = next + 2
        }
        return parts
    }

    /// A multipart body of `parts`, each with its headers in order.
    package static func write(_ parts: [(headers: [(String, String)], body: [UInt8])], boundary: String) -> [UInt8] {
        var out: [UInt8] = []
        for part in parts {
            out += Array("--\(boundary)\r\n".utf8)
            for (name, value) in part.headers { out += Array("\(name): \(value)\r\n".utf8) }
            out += [0x0D, 0x0A]
            out += part.body
            out += [0x0D, 0x0A]
        }
        out += Array("--\(boundary)--".utf8)
        return out
    }

    /// A fresh boundary that cannot occur in base64 or JSON text by accident.
    package static func newBoundary() -> String { Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) }) }

    /// The `filename` of a `Content-Disposition` header.
    package static func filename(_ disposition: String?) -> String? {
        guard let disposition, let range = disposition.range(of: "filename=") else { return nil }
        var value = String(disposition[range.upperBound...])
        if let semi = value.firstIndex(of: ";"), !value.hasPrefix("\"") { value = String(value[..<semi]) }
        value = value.trimmingCharacters(in: .whitespaces)
        if value.hasPrefix("\""), let close = value.dropFirst().firstIndex(of: "\"") {
            value = String(value[value.index(after: value.startIndex)..<close])
        }
        return value.removingPercentEncoding ?? value
    }

    private static func skipLineEnd(_ bytes: [UInt8], _ i: Int) -> Int {
        var j = i
        if j < bytes.count && bytes[j] == 0x0D { j += 1 }
        if j < bytes.count && bytes[j] == 0x0A { j += 1 }
        return j
    }

    package static func find(_ needle: [UInt8], in hay: [UInt8], from start: Int) -> Int? {
        guard !needle.isEmpty, hay.count >= needle.count, start <= hay.count - needle.count else { return nil }
        let first = needle[0]
        var i = start
        let last = hay.count - needle.count
        return hay.withUnsafeBufferPointer { h in
            needle.withUnsafeBufferPointer { n in
                while i <= last {
                    if h[i] == first {
                        var k = 1
                        while k < n.count && h[i + k] == n[k] { k += 1 }
                        if k == n.count { return i }
                    }
                    i += 1
                }
                return nil
            }
        }
    }
}

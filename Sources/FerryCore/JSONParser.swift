/// An error in JSON text, with the 1-based line and column where it was found.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public let line: Int
    public let column: Int
    public let offset: Int
    public let reason: String

    public var description: String {
        "invalid JSON at line \(line), column \(column): \(reason)"
    }
}

extension JSON {
    /// The deepest nesting of arrays and objects the parser accepts.
    public static let maximumDepth = 256

    /// Parses JSON text (RFC 8259). Rejects duplicate keys, invalid UTF-8,
    /// lone surrogates, numbers out of range and trailing content.
    public static func parse(_ text: String) throws(JSONParseError) -> JSON {
        try parse(Array(text.utf8))
    }

    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSON {
        try parse(Array(bytes))
    }

    public static func parse(_ bytes: [UInt8]) throws(JSONParseError) -> JSON {
        let result: Result<JSON, JSONParseError> = bytes.withUnsafeBufferPointer { buf in
            Result { () throws(JSONParseError) -> JSON in try parse(buf) }
        }
        return try result.get()
    }

    public static func parse(_ buffer: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSON {
        var parser = JSONParser(bytes: buffer)
        return try parser.parseDocument()
    }
}

/// A recursive-descent JSON parser over UTF-8 bytes.
///
/// Hand-rolled because Foundation's parser loses the int/double distinction,
/// accepts duplicate keys and reports no reliable position, all of which matter
/// for canonical revision digests and for clear errors on bad input.
struct JSONParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0
    var depth = 0

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    mutating func parseDocument() throws(JSONParseError) -> JSON {
        skipWhitespace()
        if index >= bytes.count { throw error("empty input", at: index) }
        let value = try parseValue()
        skipWhitespace()
        if index < bytes.count { throw error("unexpected content after the JSON value", at: index) }
        return value
    }

    func error(_ reason: String, at offset: Int) -> JSONParseError {
        var line = 1
        var column = 1
        var i = 0
        while i < offset && i < bytes.count {
            if bytes[i] == UInt8(ascii: "\n") {
                line += 1
                column = 1
            } else if bytes[i] & 0xC0 != 0x80 {
                column += 1
            }
            i += 1
        }
        return JSONParseError(line: line, column: column, offset: offset, reason: reason)
    }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return
            }
        }
    }

    func describe(_ byte: UInt8) -> String {
        if byte >= 0x21 && byte < 0x7F { return "'\(Character(Unicode.Scalar(byte)))'" }
        return "byte 0x\(String(byte, radix: 16))"
    }

    mutating func parseValue() throws(JSONParseError) -> JSON {
        guard index < bytes.count else { throw error("unexpected end of input", at: index) }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw error("unexpected \(describe(bytes[index]))", at: index)
        }
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let start = index
        let count = literal.utf8CodeUnitCount
        let lit = UnsafeBufferPointer(start: literal.utf8Start, count: count)
        guard bytes.count - index >= count else { throw error("invalid literal", at: start) }
        for i in 0..<count where bytes[index + i] != lit[i] {
            throw error("invalid literal", at: start)
        }
        index += count
    }

    mutating func enter() throws(JSONParseError) {
        depth += 1
        if depth > JSON.maximumDepth {
            throw error("nesting deeper than \(JSON.maximumDepth) levels", at: index)
        }
    }

    mutating func parseObject() throws(JSONParseError) -> JSON {
        try enter()
        index += 1
        // Room for a typical small object at once, not after three resizes.
        var fields: [String: JSON] = Dictionary(minimumCapacity: 8)
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return .object(fields)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in object", at: index) }
            guard bytes[index] == UInt8(ascii: "\"") else {
                throw error("expected a string key, found \(describe(bytes[index]))", at: index)
            }
            let keyStart = index
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else {
                throw error("expected ':' after object key", at: index)
            }
            index += 1
            skipWhitespace()
            let value = try parseValue()
            if fields.updateValue(value, forKey: key) != nil {
                throw error("duplicate key \"\(key)\"", at: keyStart)
            }
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in object", at: index) }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "}") {
                index += 1
                depth -= 1
                return .object(fields)
            }
            throw error("expected ',' or '}' in object, found \(describe(bytes[index]))", at: index)
        }
    }

    mutating func parseArray() throws(JSONParseError) -> JSON {
        try enter()
        index += 1
        var elements: [JSON] = []
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in array", at: index) }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "]") {
                index += 1
                depth -= 1
                return .array(elements)
            }
            throw error("expected ',' or ']' in array, found \(describe(bytes[index]))", at: index)
        }
    }

    mutating func parseString() throws(JSONParseError) -> String {
        let start = index
        index += 1
        let contentStart = index
        // Fast path: no escapes. Skip eight plain bytes at a time (no quote, backslash or
        // control byte among them: long text fields are most of a document's bytes).
        if let base = bytes.baseAddress {
            let ones: UInt64 = 0x0101_0101_0101_0101
            let highs: UInt64 = 0x8080_8080_8080_8080
            while index + 8 <= bytes.count {
                let w = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                let quote = w ^ (ones &* 0x22)
                let backslash = w ^ (ones &* 0x5C)
                let special =
                    ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash) | ((w &- ones &* 0x20) & ~w)
                if special & highs != 0 { break }
                index += 8
            }
        }
        while index < bytes.count {
            let b = bytes[index]
            if b == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: bytes[contentStart..<index])
                index += 1
                guard let s = String(validating: slice, as: UTF8.self) else {
                    throw error("invalid UTF-8 in string", at: contentStart)
                }
                return s
            }
            if b == UInt8(ascii: "\\") { break }
            if b < 0x20 { throw error("unescaped control character in string", at: index) }
            index += 1
        }
        guard index < bytes.count else { throw error("unterminated string", at: start) }
        // Slow path with escapes.
        var out: [UInt8] = Array(UnsafeBufferPointer(rebasing: bytes[contentStart..<index]))
        while index < bytes.count {
            let b = bytes[index]
            if b == UInt8(ascii: "\"") {
                index += 1
                guard let s = String(validating: out, as: UTF8.self) else {
                    throw error("invalid UTF-8 in string", at: contentStart)
                }
                return s
            }
            if b < 0x20 { throw error("unescaped control character in string", at: index) }
            if b != UInt8(ascii: "\\") {
                out.append(b)
                index += 1
                continue
            }
            let escapeStart = index
            index += 1
            guard index < bytes.count else { throw error("unterminated string", at: start) }
            let e = bytes[index]
            index += 1
            switch e {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5C)
            case UInt8(ascii: "/"): out.append(0x2F)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try parseHex4(escapeStart)
                if (0xD800...0xDBFF).contains(scalar) {
                    guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                        bytes[index + 1] == UInt8(ascii: "u")
                    else { throw error("lone surrogate in \\u escape", at: escapeStart) }
                    index += 2
                    let low = try parseHex4(escapeStart)
                    guard (0xDC00...0xDFFF).contains(low) else {
                        throw error("lone surrogate in \\u escape", at: escapeStart)
                    }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw error("lone surrogate in \\u escape", at: escapeStart)
                }
                guard let us = Unicode.Scalar(scalar) else {
                    throw error("invalid \\u escape", at: escapeStart)
                }
                out.append(contentsOf: UTF8.encode(us)!)
            default:
                throw error("invalid escape '\\\(Character(Unicode.Scalar(e)))'", at: escapeStart)
            }
        }
        throw error("unterminated string", at: start)
    }

    mutating func parseHex4(_ escapeStart: Int) throws(JSONParseError) -> UInt32 {
        guard bytes.count - index >= 4 else { throw error("invalid \\u escape", at: escapeStart) }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let d: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw error("invalid \\u escape", at: escapeStart)
            }
            v = v << 4 | d
            index += 1
        }
        return v
    }

    mutating func parseNumber() throws(JSONParseError) -> JSON {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid number", at: start) }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
            if index < bytes.count, isDigit(bytes[index]) {
                throw error("invalid number: leading zero", at: start)
            }
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else {
                throw error("invalid number: expected digit after '.'", at: start)
            }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard index < bytes.count, isDigit(bytes[index]) else {
                throw error("invalid number: expected digit in exponent", at: start)
            }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
        let text = String(decoding: slice, as: UTF8.self)
        if isInteger, let i = Int64(text) { return .int(i == 0 ? 0 : i) }
        guard let d = Double(text), d.isFinite else {
            throw error("number out of range", at: start)
        }
        return .number(d)
    }

    @inline(__always) func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }
}

extension JSON {
    /// The members named in `names` of the JSON object `bytes` holds; the other members are
    /// stepped over without being built. For reading a few fields of a stored document (whose
    /// bytes the store wrote): skipped values are checked only for balance and termination.
    public static func parseMembers(_ bytes: [UInt8], named names: Set<String>) throws(JSONParseError) -> [String: JSON] {
        var found: [String: JSON] = [:]
        try parseMembers(bytes, named: names, into: &found)
        return found
    }

    /// `parseMembers`, adding the members to `found` (which may hold others already).
    public static func parseMembers(_ bytes: [UInt8], named names: Set<String>, into found: inout [String: JSON])
        throws(JSONParseError)
    {
        let error: JSONParseError? = bytes.withUnsafeBufferPointer { buf in
            var parser = JSONParser(bytes: buf)
            do throws(JSONParseError) {
                try parser.parseMembers(named: names, into: &found)
                return nil
            } catch { return error }
        }
        if let error { throw error }
    }
}

extension JSONParser {
    mutating func parseMembers(named names: Set<String>, into found: inout [String: JSON]) throws(JSONParseError) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { throw error("expected an object", at: index) }
        index += 1
        var remaining = names.count
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "}") { return }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else {
                throw error("expected a string key", at: index)
            }
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else {
                throw error("expected ':' after object key", at: index)
            }
            index += 1
            skipWhitespace()
            if names.contains(key) {
                found[key] = try parseValue()
                remaining -= 1
                if remaining == 0 { return }
            } else {
                try skipValue()
            }
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in object", at: index) }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "}") { return }
            throw error("expected ',' or '}' in object", at: index)
        }
    }

    /// Steps over one value without building it.
    mutating func skipValue() throws(JSONParseError) {
        guard index < bytes.count else { throw error("unexpected end of input", at: index) }
        switch bytes[index] {
        case UInt8(ascii: "\""): try skipString()
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            let start = index
            var open = 0
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: "\""):
                    try skipString()
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): open += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    open -= 1
                    if open == 0 {
                        index += 1
                        return
                    }
                default: break
                }
                index += 1
            }
            throw error("unterminated value", at: start)
        default:
            // A number or literal runs to the next delimiter.
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x09, 0x0A, 0x0D: return
                default: index += 1
                }
            }
        }
    }

    /// Steps over a string (at its opening quote), eight plain bytes at a time.
    mutating func skipString() throws(JSONParseError) {
        let start = index
        index += 1
        if let base = bytes.baseAddress {
            let ones: UInt64 = 0x0101_0101_0101_0101
            let highs: UInt64 = 0x8080_8080_8080_8080
            while index + 8 <= bytes.count {
                let w = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                let quote = w ^ (ones &* 0x22)
                let backslash = w ^ (ones &* 0x5C)
                if (((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash)) & highs != 0 { break }
                index += 8
            }
        }
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "\""):
                index += 1
                return
            case UInt8(ascii: "\\"): index += 2
            default: index += 1
            }
        }
        throw error("unterminated string", at: start)
    }
}

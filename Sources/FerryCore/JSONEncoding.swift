#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension JSON {
    /// The canonical encoding: object keys sorted by their UTF-8 bytes, no
    /// insignificant whitespace, numbers in their shortest round-trip form
    /// (ECMAScript `Number#toString` layout), strings escaped minimally.
    /// Two equal values always produce identical bytes.
    public var canonicalBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(1024)
        JSONWriter.write(self, into: &out, pretty: false, indent: 0)
        return out
    }

    /// Appends `string` to `out` exactly as `canonicalBytes` encodes it, for writers that
    /// lay out a fixed object by hand on a hot path.
    public static func appendCanonical(string: String, to out: inout [UInt8]) {
        JSONWriter.writeString(string, into: &out)
    }

    /// The canonical encoding as a string.
    public var canonicalString: String { String(decoding: canonicalBytes, as: UTF8.self) }

    /// A human-readable encoding with two-space indentation and sorted keys.
    public var prettyString: String {
        var out: [UInt8] = []
        JSONWriter.write(self, into: &out, pretty: true, indent: 0)
        return String(decoding: out, as: UTF8.self)
    }
}

/// Serialises JSON values, canonically or indented.
enum JSONWriter {
    static func write(_ value: JSON, into out: inout [UInt8], pretty: Bool, indent: Int) {
        switch value {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): out.append(contentsOf: String(i).utf8)
        case .double(let d): out.append(contentsOf: formatDouble(d).utf8)
        case .string(let s): writeString(s, into: &out)
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (i, e) in elements.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { newline(&out, indent + 1) }
                write(e, into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty && !elements.isEmpty { newline(&out, indent) }
            out.append(UInt8(ascii: "]"))
        case .object(let fields):
            out.append(UInt8(ascii: "{"))
            let sorted = fields.sorted { utf8Less($0.key, $1.key) }
            for (i, field) in sorted.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { newline(&out, indent + 1) }
                writeString(field.key, into: &out)
                out.append(UInt8(ascii: ":"))
                if pretty { out.append(UInt8(ascii: " ")) }
                write(field.value, into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty && !sorted.isEmpty { newline(&out, indent) }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Orders strings by their UTF-8 bytes (equivalently, by Unicode scalar value).
    static func utf8Less(_ a: String, _ b: String) -> Bool {
        // Native and small strings expose their UTF-8 in place: one memcmp, no copies.
        let fast = a.utf8.withContiguousStorageIfAvailable { ua in
            b.utf8.withContiguousStorageIfAvailable { ub -> Bool in
                let n = Swift.min(ua.count, ub.count)
                if n > 0, let pa = ua.baseAddress, let pb = ub.baseAddress {
                    let c = memcmp(pa, pb, n)
                    if c != 0 { return c < 0 }
                }
                return ua.count < ub.count
            }
        }
        if let fast, let less = fast { return less }
        return a.utf8.lexicographicallyPrecedes(b.utf8)
    }

    static func newline(_ out: inout [UInt8], _ indent: Int) {
        out.append(UInt8(ascii: "\n"))
        out.append(contentsOf: repeatElement(UInt8(ascii: " "), count: indent * 2))
    }

    static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    static func writeString(_ s: String, into out: inout [UInt8]) {
        var s = s
        s.withUTF8 { writeString(utf8: $0, into: &out) }
    }

    /// Copies runs that need no escaping in bulk; only `"`, `\\` and control characters are escaped.
    static func writeString(utf8 bytes: UnsafeBufferPointer<UInt8>, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var runStart = 0
        var i = 0
        let n = bytes.count
        let raw = UnsafeRawBufferPointer(bytes)
        while i < n {
            // Skip eight plain bytes at a time (SWAR: no byte < 0x20, no '"', no '\\').
            if i + 8 <= n {
                let x = raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                let ones: UInt64 = 0x0101_0101_0101_0101
                let high: UInt64 = 0x8080_8080_8080_8080
                let quote = x ^ (ones &* 0x22)
                let backslash = x ^ (ones &* 0x5C)
                let control = (x &- ones &* 0x20) & ~x
                let isQuote = (quote &- ones) & ~quote
                let isBackslash = (backslash &- ones) & ~backslash
                if (control | isQuote | isBackslash) & high == 0 {
                    i += 8
                    continue
                }
            }
            let b = bytes[i]
            if b >= 0x20 && b != 0x22 && b != 0x5C {
                i += 1
                continue
            }
            if runStart < i { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<i])) }
            switch b {
            case 0x22: out.append(contentsOf: [0x5C, 0x22])
            case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
            case 0x08: out.append(contentsOf: [0x5C, UInt8(ascii: "b")])
            case 0x0C: out.append(contentsOf: [0x5C, UInt8(ascii: "f")])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            default:
                out.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                out.append(hexDigits[Int(b >> 4)])
                out.append(hexDigits[Int(b & 0xF)])
            }
            i += 1
            runStart = i
        }
        if runStart < n { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<n])) }
        out.append(UInt8(ascii: "\""))
    }

    /// Formats a finite double like ECMAScript's Number#toString, from Swift's
    /// shortest round-trip digits. Integral values up to 2^53 print as integers.
    static func formatDouble(_ d: Double) -> String {
        if d == 0 { return "0" }
        if !d.isFinite { return "null" }  // unreachable for parsed values; keeps output valid JSON
        if d.rounded(.towardZero) == d, abs(d) <= 9_007_199_254_740_992 { return String(Int64(d)) }
        // Swift prints plain decimals exactly as ECMAScript does; only exponent forms differ.
        let plain = d.description
        if !plain.utf8.contains(UInt8(ascii: "e")) { return plain }
        // Extract digits and exponent from Swift's shortest representation.
        var text = abs(d).description
        var exponent = 0
        if let e = text.firstIndex(where: { $0 == "e" || $0 == "E" }) {
            exponent = Int(text[text.index(after: e)...])!
            text = String(text[..<e])
        }
        var digits: String
        var pointPosition: Int
        if let dot = text.firstIndex(of: ".") {
            let intPart = text[..<dot]
            let fracPart = text[text.index(after: dot)...]
            digits = String(intPart) + String(fracPart)
            pointPosition = intPart.count
        } else {
            digits = text
            pointPosition = text.count
        }
        // Strip leading zeros (adjusting the point) and trailing zeros.
        while digits.count > 1, digits.first == "0" {
            digits.removeFirst()
            pointPosition -= 1
        }
        while digits.count > 1, digits.last == "0" { digits.removeLast() }
        let k = digits.count
        let n = pointPosition + exponent  // value = 0.digits × 10^n
        var result = d < 0 ? "-" : ""
        if k <= n && n <= 21 {
            result += digits + String(repeating: "0", count: n - k)
        } else if 0 < n && n <= 21 {
            let idx = digits.index(digits.startIndex, offsetBy: n)
            result += digits[..<idx] + "." + digits[idx...]
        } else if -6 < n && n <= 0 {
            result += "0." + String(repeating: "0", count: -n) + digits
        } else {
            let e = n - 1
            result += String(digits.first!)
            if k > 1 { result += "." + digits.dropFirst() }
            result += "e" + (e >= 0 ? "+" : "-") + String(abs(e))
        }
        return result
    }
}

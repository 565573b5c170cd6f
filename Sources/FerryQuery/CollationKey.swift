import FerryCore

extension CouchCollation {
    /// A byte string whose plain byte order (memcmp, SQLite's BLOB order) is the collation
    /// order: `compare(a, b)` and the order of `sortKey(a)` and `sortKey(b)` always agree, and
    /// equal keys mean collation-equal values. An index stores these to serve range queries.
    ///
    /// Layout: a type tag (null 1, false 2, true 3, number 4, string 5, array 6, object 7), then
    /// for a number 16 bytes (its double's order-preserving bits, then the exact integer's
    /// difference from that double); for a string its primary, secondary and tertiary weights and
    /// its code points, each level ended by 0x01 and the whole by 0x00; for an array its
    /// elements' keys then 0x00; for an object each member's key string and value key in
    /// canonical order, then 0x00.
    public static func sortKey(_ value: JSON) -> [UInt8] {
        var out: [UInt8] = []
        appendKey(value, to: &out)
        return out
    }

    /// The key of a string alone, without the type tag.
    public static func stringSortKey(_ string: String) -> [UInt8] {
        var out: [UInt8] = []
        appendStringKey(string, to: &out)
        return out
    }

    private static func appendKey(_ value: JSON, to out: inout [UInt8]) {
        switch value {
        case .null: out.append(1)
        case .bool(let b): out.append(b ? 3 : 2)
        case .int(let i):
            out.append(4)
            let d = Double(i)
            appendOrdered(d, to: &out)
            // The integer's exact distance from its nearest double breaks ties beyond 2^53.
            let rest = d >= 9_223_372_036_854_775_808.0 ? i &+ Int64.min : i - Int64(d)
            appendOrdered(rest, to: &out)
        case .double(let d):
            out.append(4)
            appendOrdered(d == 0 ? 0 : d, to: &out)
            appendOrdered(Int64(0), to: &out)
        case .string(let s):
            out.append(5)
            appendStringKey(s, to: &out)
        case .array(let items):
            out.append(6)
            for item in items { appendKey(item, to: &out) }
            out.append(0)
        case .object(let fields):
            out.append(7)
            for key in fields.keys.sorted(by: utf8Precedes) {
                appendStringKey(key, to: &out)
                appendKey(fields[key]!, to: &out)
            }
            out.append(0)
        }
    }

    /// Weights are written in base-254 digits offset by 2, so that 0x00 (end) and 0x01 (end of
    /// a level) sort before any weight.
    private static func appendStringKey(_ s: String, to out: inout [UInt8]) {
        let ws = weights(s)
        for w in ws where w.primary != 0 { appendDigits(w.primary, count: 3, to: &out) }
        out.append(1)
        for w in ws where w.secondary != 0 { appendDigits(w.secondary, count: 2, to: &out) }
        out.append(1)
        for w in ws where w.primary != 0 { out.append(UInt8(w.tertiary) + 3) }
        out.append(1)
        // UTF-8 never holds 0xFE or 0xFF, so every byte shifted by 2 still fits.
        for byte in s.utf8 { out.append(byte + 2) }
        out.append(0)
    }

    private static func appendDigits(_ value: UInt32, count: Int, to out: inout [UInt8]) {
        var digits = [UInt8](repeating: 2, count: count)
        var rest = value
        for index in stride(from: count - 1, through: 0, by: -1) {
            digits[index] = UInt8(rest % 254) + 2
            rest /= 254
        }
        out.append(contentsOf: digits)
    }

    private static func appendOrdered(_ d: Double, to out: inout [UInt8]) {
        // Flip the sign bit of positives and every bit of negatives: unsigned order = numeric order.
        let bits = d.bitPattern
        let ordered = bits & (1 << 63) != 0 ? ~bits : bits | (1 << 63)
        appendBigEndian(ordered, to: &out)
    }

    private static func appendOrdered(_ i: Int64, to out: inout [UInt8]) {
        appendBigEndian(UInt64(bitPattern: i) ^ (1 << 63), to: &out)
    }

    private static func appendBigEndian(_ value: UInt64, to out: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }
}

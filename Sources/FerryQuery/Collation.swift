import FerryCore
import Foundation

/// The result of comparing two values: which one sorts first.
public enum CollationOrder: Int, Sendable, Hashable {
    case ascending = -1
    case same = 0
    case descending = 1

    /// The order with the two sides swapped.
    public var reversed: CollationOrder { CollationOrder(rawValue: -rawValue)! }

    static func of<T: Comparable>(_ a: T, _ b: T) -> CollationOrder {
        a < b ? .ascending : (a > b ? .descending : .same)
    }
}

/// CouchDB's collation of JSON values (view keys, Mango `$gt`/`$lt` and sort), as Ferry
/// approximates it: null < false < true < numbers < strings < arrays < objects.
///
/// Strings follow a documented subset of the Unicode Collation Algorithm that CouchDB gets from
/// ICU: characters compare case- and accent-insensitively first (whitespace, then punctuation and
/// symbols, then digits, then letters; accented Latin letters with their base letter), then by
/// accents, then lowercase before uppercase; other characters sort after all ASCII letters, by
/// code point. docs/queries.md lists the known differences.
public enum CouchCollation {
    /// Compares two JSON values in CouchDB's view collation.
    public static func compare(_ a: JSON, _ b: JSON) -> CollationOrder {
        let (ra, rb) = (typeRank(a), typeRank(b))
        if ra != rb { return CollationOrder.of(ra, rb) }
        switch (a, b) {
        case (.null, .null): return .same
        case (.bool(let x), .bool(let y)): return CollationOrder.of(x ? 1 : 0, y ? 1 : 0)
        case (.string(let x), .string(let y)): return compareStrings(x, y)
        case (.array(let x), .array(let y)):
            for (ex, ey) in zip(x, y) {
                let order = compare(ex, ey)
                if order != .same { return order }
            }
            return CollationOrder.of(x.count, y.count)
        case (.object(let x), .object(let y)):
            return compareMembers(x, y, keys: compareStrings, values: compare)
        default:
            return compareNumbers(a, b)
        }
    }

    /// Whether `a` sorts strictly before `b`; usable as a `sort(by:)` predicate.
    public static func precedes(_ a: JSON, _ b: JSON) -> Bool { compare(a, b) == .ascending }

    /// Compares two strings in Ferry's approximation of ICU's root collation.
    ///
    /// Level 1 compares the characters' primary weights (letters case-folded and stripped of
    /// accents, ignorable control characters skipped), a shorter prefix first; level 2 compares
    /// accents; level 3 puts lowercase before uppercase; strings still tied compare by code
    /// points, so only identical strings are `.same`.
    public static func compareStrings(_ a: String, _ b: String) -> CollationOrder {
        if a.utf8.elementsEqual(b.utf8) { return .same }
        if a.utf8.allSatisfy({ $0 < 0x80 }) && b.utf8.allSatisfy({ $0 < 0x80 }) {
            return compareASCII(a, b)
        }
        let wa = weights(a)
        let wb = weights(b)
        let primary = compareLevel(wa, wb) { $0.primary }
        if primary != .same { return primary }
        let secondary = compareLevel(wa, wb) { $0.secondary }
        if secondary != .same { return secondary }
        let tertiary = compareLevel(wa, wb) { $0.primary == 0 ? 0 : UInt32($0.tertiary) + 1 }
        if tertiary != .same { return tertiary }
        return compareCodePoints(a, b)
    }

    /// The common case in one pass: ASCII has no secondary level.
    private static func compareASCII(_ a: String, _ b: String) -> CollationOrder {
        var ia = a.utf8.makeIterator()
        var ib = b.utf8.makeIterator()
        var tertiary = CollationOrder.same
        while true {
            let wa = nextASCIIWeight(&ia)
            let wb = nextASCIIWeight(&ib)
            switch (wa, wb) {
            case (nil, nil):
                return tertiary != .same ? tertiary : compareCodePoints(a, b)
            case (nil, _): return .ascending
            case (_, nil): return .descending
            case (let x?, let y?):
                if x.primary != y.primary { return CollationOrder.of(x.primary, y.primary) }
                if tertiary == .same && x.tertiary != y.tertiary {
                    tertiary = CollationOrder.of(x.tertiary, y.tertiary)
                }
            }
        }
    }

    private static func nextASCIIWeight(_ it: inout String.UTF8View.Iterator) -> Weight? {
        while let byte = it.next() {
            let w = asciiWeights[Int(byte)]
            if w.primary != 0 { return w }  // control characters are ignorable at every level
        }
        return nil
    }

    /// Compares one level: the sequences of non-zero weights, a prefix first.
    private static func compareLevel(_ a: [Weight], _ b: [Weight], _ level: (Weight) -> UInt32) -> CollationOrder {
        var i = 0
        var j = 0
        while true {
            var x: UInt32 = 0
            while i < a.count {
                x = level(a[i])
                i += 1
                if x != 0 { break }
            }
            var y: UInt32 = 0
            while j < b.count {
                y = level(b[j])
                j += 1
                if y != 0 { break }
            }
            if x != y { return CollationOrder.of(x, y) }  // 0 means "ended", which sorts first
            if x == 0 { return .same }
        }
    }

    /// Compares two values the way CouchDB compares `_id` in a selector: Erlang term order
    /// (numbers < false < null < true < objects < arrays < strings) with strings by their
    /// UTF-8 bytes, as `_all_docs` orders IDs.
    public static func compareRaw(_ a: JSON, _ b: JSON) -> CollationOrder {
        let (ra, rb) = (rawRank(a), rawRank(b))
        if ra != rb { return CollationOrder.of(ra, rb) }
        switch (a, b) {
        case (.string(let x), .string(let y)): return compareCodePoints(x, y)
        case (.array(let x), .array(let y)):
            for (ex, ey) in zip(x, y) {
                let order = compareRaw(ex, ey)
                if order != .same { return order }
            }
            return CollationOrder.of(x.count, y.count)
        case (.object(let x), .object(let y)):
            return compareMembers(x, y, keys: compareCodePoints, values: compareRaw)
        case (.int, _), (.double, _): return compareNumbers(a, b)
        default: return .same  // equal ranks among null/true/false are equal atoms
        }
    }

    /// Numbers by value, integers and doubles mixed (1 and 1.0 are the same).
    public static func compareNumbers(_ a: JSON, _ b: JSON) -> CollationOrder {
        switch (a, b) {
        case (.int(let x), .int(let y)): return CollationOrder.of(x, y)
        case (.double(let x), .double(let y)): return CollationOrder.of(x, y)
        case (.int(let x), .double(let y)): return compare(int: x, double: y)
        case (.double(let x), .int(let y)): return compare(int: y, double: x).reversed
        default: return .same
        }
    }

    // MARK: - Pieces

    private static func typeRank(_ value: JSON) -> Int {
        switch value {
        case .null: return 0
        case .bool(let b): return b ? 2 : 1
        case .int, .double: return 3
        case .string: return 4
        case .array: return 5
        case .object: return 6
        }
    }

    private static func rawRank(_ value: JSON) -> Int {
        switch value {
        case .int, .double: return 0
        case .bool(false): return 1
        case .null: return 2
        case .bool(true): return 3
        case .object: return 4
        case .array: return 5
        case .string: return 6
        }
    }

    /// Ferry keeps no member order, so objects compare member by member in their canonical
    /// order (keys by UTF-8 bytes), each key then its value, then the smaller object first.
    private static func compareMembers(
        _ x: [String: JSON], _ y: [String: JSON],
        keys: (String, String) -> CollationOrder, values: (JSON, JSON) -> CollationOrder
    ) -> CollationOrder {
        let kx = x.keys.sorted(by: utf8Precedes)
        let ky = y.keys.sorted(by: utf8Precedes)
        for (a, b) in zip(kx, ky) {
            let keyOrder = keys(a, b)
            if keyOrder != .same { return keyOrder }
            let valueOrder = values(x[a]!, y[b]!)
            if valueOrder != .same { return valueOrder }
        }
        return CollationOrder.of(kx.count, ky.count)
    }

    static func utf8Precedes(_ a: String, _ b: String) -> Bool {
        a.utf8.lexicographicallyPrecedes(b.utf8)
    }

    static func compareCodePoints(_ a: String, _ b: String) -> CollationOrder {
        if a.utf8.elementsEqual(b.utf8) { return .same }
        return utf8Precedes(a, b) ? .ascending : .descending
    }

    private static func compare(int i: Int64, double d: Double) -> CollationOrder {
        if d >= 9_223_372_036_854_775_808.0 { return .ascending }
        if d < -9_223_372_036_854_775_808.0 { return .descending }
        let whole = d.rounded(.towardZero)
        let order = CollationOrder.of(i, Int64(whole))
        if order != .same { return order }
        let fraction = d - whole
        return fraction > 0 ? .ascending : (fraction < 0 ? .descending : .same)
    }

    // MARK: - String weights

    /// One character's collation weights at the primary, secondary and tertiary levels
    /// (0 = none at that level).
    struct Weight: Sendable {
        var primary: UInt32
        var secondary: UInt32 = 0
        var tertiary: UInt8
    }

    /// Every base character's secondary weight; accents weigh more.
    private static let baseSecondary: UInt32 = 1

    /// The weights of each character: ASCII from the documented table; a Latin letter with
    /// accents (by canonical decomposition) as its base letter plus one secondary weight per
    /// accent; anything else after all ASCII, by code point.
    static func weights(_ s: String) -> [Weight] {
        var out: [Weight] = []
        out.reserveCapacity(s.utf8.count)
        for scalar in s.unicodeScalars {
            let v = scalar.value
            if v < 128 {
                let w = asciiWeights[Int(v)]
                if w.primary != 0 { out.append(w) }
                continue
            }
            if let accent = accentSecondary(v) {
                out.append(Weight(primary: 0, secondary: accent, tertiary: 0))
                continue
            }
            if let decomposed = latinDecomposition(scalar) {
                out.append(contentsOf: decomposed)
                continue
            }
            out.append(Weight(primary: 0x1_0000 + v, secondary: baseSecondary, tertiary: 0))
        }
        return out
    }

    /// A Latin letter with accents (é, Ö, ñ, ç, ů…) as its ASCII base letter's weight followed by
    /// its accents' secondary weights; nil for anything else.
    private static func latinDecomposition(_ scalar: Unicode.Scalar) -> [Weight]? {
        let v = scalar.value
        if (0xC0...0x24F).contains(v) { return latinTable[Int(v - 0xC0)] }
        if (0x1E00...0x1EFF).contains(v) { return latinTable[Int(v - 0x1E00) + 0x190] }
        return nil
    }

    /// Decompositions of Latin-1 Supplement, Latin Extended-A/B and Latin Extended Additional,
    /// worked out once.
    private static let latinTable: [[Weight]?] = {
        let scalars = Array(0xC0...0x24F) + Array(0x1E00...0x1EFF)
        return scalars.map { value -> [Weight]? in
            guard let scalar = Unicode.Scalar(UInt32(value)) else { return nil }
            let parts = Array(String(scalar).decomposedStringWithCanonicalMapping.unicodeScalars)
            guard parts.count > 1, parts[0].value < 128, parts[0].properties.isAlphabetic else { return nil }
            var out = [asciiWeights[Int(parts[0].value)]]
            for mark in parts.dropFirst() {
                guard let accent = accentSecondary(mark.value) else { return nil }
                out.append(Weight(primary: 0, secondary: accent, tertiary: 0))
            }
            return out
        }
    }()

    /// Secondary weights of combining accents: the common ones in ICU's order
    /// (é < è < ĕ < ê < ě < e̊ < ë < ő < ẽ < ė < ȩ < ę < ē), the rest after them by code point.
    private static func accentSecondary(_ v: UInt32) -> UInt32? {
        guard (0x300...0x36F).contains(v) else { return nil }
        let common: [UInt32] = [0x301, 0x300, 0x306, 0x302, 0x30C, 0x30A, 0x308, 0x30B, 0x303, 0x307, 0x327, 0x328, 0x304]
        if let rank = common.firstIndex(of: v) { return 2 + UInt32(rank) }
        return 0x100 + v
    }

    /// The ASCII order of ICU's root collation (as in ICU 72; CouchDB's documentation shows an
    /// older ICU's, with `` ` `` and `^` first): whitespace, then
    /// `` _ - , ; : ! ? . ' " ( ) [ ] { } @ * / \ & # % ` ^ + < = > | ~ $ ``, then digits, then
    /// letters with `a` < `A` < `b` < `B` …
    static let asciiOrder: [String] = {
        var order: [String] = ["\t", "\n", "\u{0B}", "\u{0C}", "\r", " "]
        order += "_-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$".map { String($0) }
        order += "0123456789".map { String($0) }
        for letter in "abcdefghijklmnopqrstuvwxyz" {
            order.append(String(letter))
            order.append(letter.uppercased())
        }
        return order
    }()

    private static let asciiWeights: [Weight] = {
        var weights = [Weight](repeating: Weight(primary: 0, tertiary: 0), count: 128)
        var primary: UInt32 = 1
        for entry in asciiOrder {
            let v = Int(entry.unicodeScalars.first!.value)
            let scalar = entry.unicodeScalars.first!
            if scalar.properties.isUppercase {
                // Shares its lowercase letter's primary weight, one step up at level 3.
                weights[v] = Weight(primary: weights[v + 32].primary, secondary: baseSecondary, tertiary: 1)
            } else {
                weights[v] = Weight(primary: primary, secondary: baseSecondary, tertiary: 0)
                primary += 1
            }
        }
        return weights
    }()
}

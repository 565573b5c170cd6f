import FerryCore
import FerryQuery
import Testing

private func json(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite struct CollationTests {
    /// The example ordering from CouchDB's "Views Collation" documentation (the one member-order
    /// example left out; see `objectsCompareInCanonicalKeyOrder`).
    static let documentedOrder: [String] = [
        "null", "false", "true",
        "1", "2", "3.0", "4",
        "\"a\"", "\"A\"", "\"aa\"", "\"b\"", "\"B\"", "\"ba\"", "\"bb\"",
        "[\"a\"]", "[\"b\"]", "[\"b\",\"c\"]", "[\"b\",\"c\",\"a\"]", "[\"b\",\"d\"]", "[\"b\",\"d\",\"e\"]",
        "{\"a\":1}", "{\"a\":2}", "{\"b\":1}", "{\"b\":2}", "{\"b\":2,\"c\":2}",
    ]

    @Test func theDocumentedExampleSequenceIsInAscendingOrder() {
        let values = Self.documentedOrder.map(json)
        for i in values.indices {
            for j in values.indices {
                let expected: CollationOrder = i < j ? .ascending : (i == j ? .same : .descending)
                #expect(CouchCollation.compare(values[i], values[j]) == expected,
                        "\(Self.documentedOrder[i]) vs \(Self.documentedOrder[j])")
            }
        }
    }

    @Test func sortingShuffledValuesRestoresTheDocumentedOrder() {
        var generator = SeededGenerator(seed: 7)
        let values = Self.documentedOrder.map(json)
        for _ in 0..<20 {
            let sorted = values.shuffled(using: &generator).sorted(by: CouchCollation.precedes)
            #expect(sorted == values)
        }
    }

    @Test func printableASCIIFollowsICUsRootOrder() {
        // ICU 72's root order for characters 32…126 (CouchDB's documentation shows an older
        // ICU's, which put ` and ^ first).
        let documented = " _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ"
        let chars = documented.map { String($0) }
        #expect(Set(chars).count == 95)
        for (a, b) in zip(chars, chars.dropFirst()) {
            #expect(CouchCollation.compareStrings(a, b) == .ascending, "\(a) < \(b)")
        }
    }

    @Test func lettersCompareWithoutCaseFirstThenLowercaseFirst() {
        let ordered = ["abc", "Abc", "ABC", "abc1", "AbcZZZZZ"]
        for (a, b) in zip(ordered, ordered.dropFirst()) {
            #expect(CouchCollation.compareStrings(a, b) == .ascending, "\(a) < \(b)")
        }
        #expect(CouchCollation.compareStrings("A", "aa") == .ascending)
        #expect(CouchCollation.compareStrings("a", "AA") == .ascending)
        #expect(CouchCollation.compareStrings("aB", "Ab") == .ascending)
        #expect(CouchCollation.compareStrings("~", "0") == .ascending)
        #expect(CouchCollation.compareStrings("10", "9") == .ascending)
        #expect(CouchCollation.compareStrings("a b", "ab") == .ascending)
    }

    @Test func accentedLatinLettersSortWithTheirBaseLetterThenByAccent() {
        let ordered = ["e", "E", "é", "É", "è", "ê", "ë", "ea", "éa", "f"]
        for (a, b) in zip(ordered, ordered.dropFirst()) {
            #expect(CouchCollation.compareStrings(a, b) == .ascending, "\(a) < \(b)")
        }
        // Accents outrank case: resume < Resume < résumé < Résumé.
        let words = ["resume", "Resume", "résumé", "Résumé"]
        for (a, b) in zip(words, words.dropFirst()) {
            #expect(CouchCollation.compareStrings(a, b) == .ascending, "\(a) < \(b)")
        }
        // A precomposed letter and its decomposed spelling differ only in code points.
        #expect(CouchCollation.compareStrings("\u{E9}", "e\u{301}") != .same)
        #expect(CouchCollation.compareStrings("\u{E9}x", "e\u{301}y") == .ascending)
        #expect(CouchCollation.compareStrings("ñ", "o") == .ascending)
    }

    @Test func asciiAndAccentedLatinTextSortsAsICUSortsIt() {
        let strings = ICUOrderFixture.sorted
        #expect(strings.count == 300)
        var misordered: [String] = []
        for i in strings.indices {
            for j in strings.indices where i < j && CouchCollation.compareStrings(strings[i], strings[j]) != .ascending {
                misordered.append("\(strings[i].debugDescription) < \(strings[j].debugDescription)")
            }
        }
        #expect(misordered.isEmpty, "\(misordered.prefix(20))")
    }

    @Test func otherCharactersSortAfterASCIILettersByCodePoint() {
        #expect(CouchCollation.compareStrings("z", "ø") == .ascending)
        #expect(CouchCollation.compareStrings("Zz", "日") == .ascending)
        #expect(CouchCollation.compareStrings("ø", "日") == .ascending)
        #expect(CouchCollation.compareStrings("日本", "日本") == .same)
    }

    @Test func onlyIdenticalStringsAreTheSame() {
        // A control character is ignorable at every level, so the code points break the tie.
        #expect(CouchCollation.compareStrings("a\u{01}b", "ab") != .same)
        #expect(CouchCollation.compareStrings("ab", "ab") == .same)
        #expect(CouchCollation.compareStrings("", "") == .same)
        #expect(CouchCollation.compareStrings("", "a") == .ascending)
    }

    @Test func numbersCompareByValueAcrossIntegersAndDoubles() {
        #expect(CouchCollation.compare(.int(1), .double(1.0)) == .same)
        #expect(CouchCollation.compare(.int(1), .double(1.5)) == .ascending)
        #expect(CouchCollation.compare(.double(1.5), .int(2)) == .ascending)
        #expect(CouchCollation.compare(.double(-1.5), .int(-1)) == .ascending)
        #expect(CouchCollation.compare(.int(-2), .double(-1.5)) == .ascending)
        #expect(CouchCollation.compare(.int(Int64.max), .double(1e19)) == .ascending)
        #expect(CouchCollation.compare(.int(Int64.min), .double(-1e19)) == .descending)
        #expect(CouchCollation.compare(.int(9_007_199_254_740_993), .double(9_007_199_254_740_992)) == .descending)
    }

    @Test func arraysCompareElementWiseThenShorterFirst() {
        #expect(CouchCollation.compare(json("[1, \"a\"]"), json("[1, \"b\"]")) == .ascending)
        #expect(CouchCollation.compare(json("[1]"), json("[1, null]")) == .ascending)
        #expect(CouchCollation.compare(json("[]"), json("[null]")) == .ascending)
        #expect(CouchCollation.compare(json("[2]"), json("[1, 9]")) == .descending)
    }

    @Test func objectsCompareInCanonicalKeyOrder() {
        // Ferry keeps no member order: {"b":2,"a":1} is {"a":1,"b":2}, which sorts between
        // {"a":1} and {"a":2} (CouchDB, keeping the written order, puts it after {"b":2}).
        let value = json("{\"b\":2,\"a\":1}")
        #expect(CouchCollation.compare(json("{\"a\":1}"), value) == .ascending)
        #expect(CouchCollation.compare(value, json("{\"a\":2}")) == .ascending)
        #expect(CouchCollation.compare(json("{}"), json("{\"a\":null}")) == .ascending)
    }

    @Test func rawOrderComparesStringsByBytesAsIDsAreSorted() {
        #expect(CouchCollation.compareRaw("B", "a") == .ascending)
        #expect(CouchCollation.compare("B", "a") == .descending)
        #expect(CouchCollation.compareRaw(.null, "x") == .ascending)
        #expect(CouchCollation.compareRaw(.int(5), .null) == .ascending)
        #expect(CouchCollation.compareRaw(.array(["x"]), "a") == .ascending)
    }

    @Test func collationIsATotalOrderOnRandomValues() {
        var generator = SeededGenerator(seed: 0xC011A7E)
        let values = (0..<120).map { _ in RandomJSON.value(depth: 2, using: &generator) }
        for a in values {
            #expect(CouchCollation.compare(a, a) == .same)
            for b in values {
                let ab = CouchCollation.compare(a, b)
                #expect(ab == CouchCollation.compare(b, a).reversed)
            }
        }
        let sorted = values.sorted(by: CouchCollation.precedes)
        for (a, b) in zip(sorted, sorted.dropFirst()) {
            #expect(CouchCollation.compare(a, b) != .descending)
        }
        // Transitivity on triples drawn from the sorted list.
        for _ in 0..<500 {
            let i = Int.random(in: 0..<sorted.count, using: &generator)
            let j = Int.random(in: i..<sorted.count, using: &generator)
            let k = Int.random(in: j..<sorted.count, using: &generator)
            #expect(CouchCollation.compare(sorted[i], sorted[k]) != .descending)
            #expect(CouchCollation.compare(sorted[i], sorted[j]) != .descending)
        }
    }
}

/// Random JSON values for property tests, with types deliberately mixed.
enum RandomJSON {
    static let strings = ["", "a", "A", "aa", "b", "B", "ab", "a b", "-a", "1", "10", "9", "é", "z", "Z", "~", "_id"]

    static func scalar(using g: inout SeededGenerator) -> JSON {
        switch Int.random(in: 0..<7, using: &g) {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &g))
        case 2: return .int(Int64.random(in: -5...5, using: &g))
        case 3: return .number(Double(Int.random(in: -20...20, using: &g)) / 4)
        default: return .string(strings.randomElement(using: &g)!)
        }
    }

    static func value(depth: Int, using g: inout SeededGenerator) -> JSON {
        guard depth > 0 else { return scalar(using: &g) }
        switch Int.random(in: 0..<6, using: &g) {
        case 0:
            return .array((0..<Int.random(in: 0...3, using: &g)).map { _ in value(depth: depth - 1, using: &g) })
        case 1:
            var fields: [String: JSON] = [:]
            for _ in 0..<Int.random(in: 0...3, using: &g) {
                fields[["a", "b", "c"].randomElement(using: &g)!] = value(depth: depth - 1, using: &g)
            }
            return .object(fields)
        default:
            return scalar(using: &g)
        }
    }
}

@Suite struct CollationKeyTests {
    private func keyOrder(_ a: JSON, _ b: JSON) -> CollationOrder {
        let (ka, kb) = (CouchCollation.sortKey(a), CouchCollation.sortKey(b))
        if ka == kb { return .same }
        return ka.lexicographicallyPrecedes(kb) ? .ascending : .descending
    }

    @Test func sortKeysOrderRandomValuesAsTheCollationDoes() {
        var generator = SeededGenerator(seed: 0x50B7)
        let values = (0..<250).map { _ in RandomJSON.value(depth: 3, using: &generator) }
        var disagreements: [String] = []
        for a in values {
            for b in values where keyOrder(a, b) != CouchCollation.compare(a, b) {
                disagreements.append("\(a.canonicalString) vs \(b.canonicalString)")
            }
        }
        #expect(disagreements.isEmpty, "\(disagreements.prefix(10))")
    }

    @Test func sortKeysOrderTheDocumentedSequenceAndICUsStrings() {
        let documented = CollationTests.documentedOrder.map { try! JSON.parse($0) }
        for (a, b) in zip(documented, documented.dropFirst()) {
            #expect(keyOrder(a, b) == .ascending, "\(a.canonicalString) < \(b.canonicalString)")
        }
        let strings = ICUOrderFixture.sorted.map { JSON.string($0) }
        for (a, b) in zip(strings, strings.dropFirst()) {
            #expect(keyOrder(a, b) == .ascending, "\(a.canonicalString) < \(b.canonicalString)")
        }
    }

    @Test func sortKeysOrderNumbersExactlyAcrossIntegersAndDoubles() {
        let ordered: [JSON] = [
            .int(Int64.min), .double(-1e18), .int(-9_007_199_254_740_993), .int(-9_007_199_254_740_992),
            .double(-1.5), .int(-1), .int(0), .double(0.25), .int(1), .double(1.5), .int(2),
            .int(9_007_199_254_740_992), .int(9_007_199_254_740_993), .int(Int64.max - 1), .int(Int64.max),
            .double(1e19), .double(1e300),
        ]
        for (a, b) in zip(ordered, ordered.dropFirst()) {
            #expect(CouchCollation.compare(a, b) == .ascending, "\(a) < \(b)")
            #expect(keyOrder(a, b) == .ascending, "\(a) < \(b)")
        }
        #expect(keyOrder(.int(1), .double(1.0)) == .same)
        #expect(keyOrder(.int(0), .double(-0.0)) == .same)
    }
}

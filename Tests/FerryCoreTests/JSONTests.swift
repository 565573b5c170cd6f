import Testing
@testable import FerryCore

@Suite struct JSONTests {
    @Test func canonicalEncodingSortsKeysAndDropsWhitespace() throws {
        let v = try JSON.parse(#"{ "b" : [1, 2, {"z":null,"a":true}], "a": "x" }"#)
        #expect(v.canonicalString == #"{"a":"x","b":[1,2,{"a":true,"z":null}]}"#)
    }

    @Test func objectKeysAreOrderedByTheirUTF8BytesWhateverTheirLengthOrScript() {
        let keys = [
            "b", "a", "ab", "", "z", "Z", "é", "日本", "\u{1F600}", "ä", "a-key-long-enough-to-live-on-the-heap-2",
            "a-key-long-enough-to-live-on-the-heap-", "a-key-long-enough-to-live-on-the-heap-10",
        ]
        var fields: [String: JSON] = [:]
        for (i, k) in keys.enumerated() { fields[k] = .int(Int64(i)) }
        let byBytes = keys.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        let expected = "{" + byBytes.map { k in "\"\(k)\":\(keys.firstIndex(of: k)!)" }.joined(separator: ",") + "}"
        #expect(JSON.object(fields).canonicalString == expected)
    }

    @Test func equalNumbersInDifferentSpellingsEncodeIdentically() throws {
        for text in ["1", "1.0", "1e0", "10e-1", "0.1e1"] {
            #expect(try JSON.parse(text).canonicalString == "1", "\(text)")
        }
        #expect(try JSON.parse("-0").canonicalString == "0")
        #expect(try JSON.parse("-0.0").canonicalString == "0")
        #expect(try JSON.parse("1e2").canonicalString == "100")
    }

    @Test func doublesUseShortestRoundTripInECMAScriptLayout() throws {
        let cases: [(String, String)] = [
            ("0.1", "0.1"), ("123.456", "123.456"), ("1e21", "1e+21"), ("1.5e21", "1.5e+21"),
            ("1e-7", "1e-7"), ("0.000001", "0.000001"), ("1.25e-7", "1.25e-7"), ("-2.5", "-2.5"),
            ("5e-324", "5e-324"), ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("123456789012345680000", "123456789012345680000"), ("0.30000000000000004", "0.30000000000000004"),
        ]
        for (input, expected) in cases {
            #expect(try JSON.parse(input).canonicalString == expected, "\(input)")
        }
    }

    @Test func largeIntegersKeepFullPrecision() throws {
        #expect(try JSON.parse("9223372036854775807").canonicalString == "9223372036854775807")
        #expect(try JSON.parse("-9223372036854775808") == .int(Int64.min))
    }

    @Test func stringsAreEscapedMinimally() throws {
        let v = try JSON.parse(#""a\"b\\c\/d\n\t\u0001\u00e9\ud83d\ude00""#)
        #expect(v == .string("a\"b\\c/d\n\t\u{01}é😀"))
        #expect(v.canonicalString == #""a\"b\\c/d\n\t\u0001é😀""#)
    }

    @Test func parseErrorsNameLineAndColumn() {
        #expect(throws: JSONParseError.self) { try JSON.parse("{\n  \"a\": 1,\n}") }
        do {
            _ = try JSON.parse("{\n  \"a\": 1,\n}")
        } catch {
            #expect(error.line == 3)
            #expect(error.column == 1)
            #expect(error.description.contains("line 3, column 1"))
        }
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"", "[1] 2",
        "\"\\ud800\"", "\"\\udc00x\"", "{\"a\":1,\"a\":2}", "1e999", "nul", "\"a\u{01}\"",
    ])
    func invalidJSONIsRejected(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSON.parse(text) }
    }

    @Test func invalidUTF8IsRejected() {
        #expect(throws: JSONParseError.self) { try JSON.parse([0x22, 0xFF, 0xFE, 0x22]) }
    }

    @Test func nestingBeyondTheLimitIsRejected() {
        let deep = String(repeating: "[", count: 300) + String(repeating: "]", count: 300)
        #expect(throws: JSONParseError.self) { try JSON.parse(deep) }
        let ok = String(repeating: "[", count: 200) + String(repeating: "]", count: 200)
        #expect(throws: Never.self) { try JSON.parse(ok) }
    }

    @Test func randomValuesRoundTripThroughCanonicalEncoding() throws {
        var rng = SeededGenerator(seed: 42)
        for _ in 0..<500 {
            let v = randomJSON(&rng, depth: 0)
            let bytes = v.canonicalBytes
            let back = try JSON.parse(bytes)
            #expect(back.canonicalBytes == bytes)
        }
    }
}


func randomJSON(_ rng: inout SeededGenerator, depth: Int) -> JSON {
    let pick = Int.random(in: 0..<(depth > 3 ? 5 : 7), using: &rng)
    switch pick {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2: return .int(Int64.random(in: -1_000_000...1_000_000, using: &rng))
    case 3: return .number(Double.random(in: -1e6...1e6, using: &rng))
    case 4:
        let chars = Array("aé😀\"\\\n\u{01}z ")
        return .string(String((0..<Int.random(in: 0..<8, using: &rng)).map { _ in chars.randomElement(using: &rng)! }))
    case 5: return .array((0..<Int.random(in: 0..<4, using: &rng)).map { _ in randomJSON(&rng, depth: depth + 1) })
    default:
        var o: [String: JSON] = [:]
        for i in 0..<Int.random(in: 0..<4, using: &rng) { o["k\(i)\(Int.random(in: 0..<9, using: &rng))"] = randomJSON(&rng, depth: depth + 1) }
        return .object(o)
    }
}

@Suite struct JSONEscapingTests {
    @Test func specialCharactersAreEscapedAtEveryPositionOfLongStrings() throws {
        let specials: [(Character, String)] = [("\"", "\\\""), ("\\", "\\\\"), ("\n", "\\n"), ("\u{1F}", "\\u001f")]
        for (special, escaped) in specials {
            for position in 0..<24 {
                var chars = Array(repeating: Character("a"), count: 24)
                chars[position] = special
                let text = String(chars)
                let expected = "\"" + String(repeating: "a", count: position) + escaped
                    + String(repeating: "a", count: 23 - position) + "\""
                #expect(JSON.string(text).canonicalString == expected, "\(position)")
                #expect(try JSON.parse(expected) == .string(text))
            }
        }
    }

    @Test func aRawControlByteIsRejectedAtEveryPositionOfALongString() {
        for control: UInt8 in [0x00, 0x0A, 0x1F] {
            for position in 0..<40 {
                var bytes = Array("\"".utf8) + Array(repeating: UInt8(ascii: "a"), count: 40) + Array("\"".utf8)
                bytes[1 + position] = control
                #expect(throws: JSONParseError.self, "\(control) at \(position)") { try JSON.parse(bytes) }
            }
        }
    }

    @Test func longStringsEndAtTheirFirstQuoteWhereverItFalls() throws {
        for length in 0..<40 {
            let text = String(repeating: "é", count: length / 2) + String(repeating: "z", count: length - length / 2)
            #expect(try JSON.parse(#"{"k":""# + text + #"","n":1}"#) == ["k": .string(text), "n": 1])
            #expect(throws: JSONParseError.self) { try JSON.parse(#"""# + text) }  // unterminated
        }
    }

    @Test func multibyteTextPassesThroughUnescaped() {
        let text = String(repeating: "päivää 😀 ", count: 5)
        #expect(JSON.string(text).canonicalString == "\"" + text + "\"")
    }
}

/// `JSON.parseMembers`: a few members of an object, the rest stepped over.
@Suite struct JSONParseMembersTests {
    @Test func namedMembersEqualThoseOfAWholeParseWhateverTheOthersHold() throws {
        let text = #"{"a":"x \"q\" \\ \u00e9 \ud83d\ude00 long long long long","b":[1,{"c":"]}"},[[]],-2.5e3,true,null],"c":{"d":{"e":[]}},"n":-12,"t":true,"z":"end"}"#
        let whole = try JSON.parse(text).objectValue!
        let bytes = Array(text.utf8)
        for names in [["z"], ["a", "n"], ["b", "c"], ["t"], ["missing"], ["a", "b", "c", "n", "t", "z"], []] {
            let some = try JSON.parseMembers(bytes, named: Set(names))
            #expect(some == whole.filter { names.contains($0.key) }, "\(names)")
        }
        #expect(try JSON.parseMembers(Array("{}".utf8), named: ["a"]).isEmpty)
    }

    @Test func randomDocumentsGiveTheSameMembersAsAWholeParse() throws {
        var rng = SeededGenerator(seed: 1807)
        for _ in 0..<300 {
            let doc = JSON.object(Dictionary(uniqueKeysWithValues: (0..<Int.random(in: 0...6, using: &rng)).map { i in
                ("k\(i)", randomValue(depth: 3, &rng))
            }))
            let bytes = doc.canonicalBytes
            let names: Set<String> = Set((0..<4).map { _ in "k\(Int.random(in: 0...7, using: &rng))" })
            let some = try JSON.parseMembers(bytes, named: names)
            // Compared with a whole parse of the same text (canonical text writes 12.0 as 12).
            #expect(some == (try JSON.parse(bytes)).objectValue!.filter { names.contains($0.key) })
        }
    }

    @Test func aTruncatedOrNonObjectInputIsAnError() {
        #expect(throws: JSONParseError.self) { try JSON.parseMembers(Array(#"{"a":"x"#.utf8), named: ["b"]) }
        #expect(throws: JSONParseError.self) { try JSON.parseMembers(Array(#"{"a":[1,2"#.utf8), named: ["b"]) }
        #expect(throws: JSONParseError.self) { try JSON.parseMembers(Array("[1]".utf8), named: ["a"]) }
    }

    private func randomValue(depth: Int, _ rng: inout SeededGenerator) -> JSON {
        switch Int.random(in: 0...(depth > 0 ? 7 : 5), using: &rng) {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &rng))
        case 2: return .int(Int64.random(in: -1000...1000, using: &rng))
        case 3: return .double(Double(Int.random(in: -100...100, using: &rng)) / 8)
        case 4, 5:
            let pieces = ["a", "\"", "\\", "]", "}", "{", "[", ",", ":", "é", "😀", "\n", "\u{1}", " "]
            return .string((0..<Int.random(in: 0...12, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined())
        case 6: return .array((0..<Int.random(in: 0...3, using: &rng)).map { _ in randomValue(depth: depth - 1, &rng) })
        default:
            return .object(Dictionary(uniqueKeysWithValues: (0..<Int.random(in: 0...3, using: &rng)).map { i in
                ("m\(i)", randomValue(depth: depth - 1, &rng))
            }))
        }
    }
}

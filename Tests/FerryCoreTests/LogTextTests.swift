import Testing
@testable import FerryCore

@Suite struct LogTextTests {
    @Test func plainTextIncludingNonASCIIIsUnchanged() {
        #expect(LogText.escape("kitchen-tablet") == "kitchen-tablet")
        #expect(LogText.escape("päivä/2026: \"x\" y=z") == "päivä/2026: \"x\" y=z")
        #expect(LogText.escape("日本語 🚢") == "日本語 🚢")
    }

    @Test func newlinesCannotForgeALogLine() {
        let forged = "tablet\n2026-11-24T04:00:00+0000 error ferry.node : admin key leaked"
        let escaped = LogText.escape(forged)
        #expect(!escaped.contains("\n"))
        #expect(escaped == #"tablet\n2026-11-24T04:00:00+0000 error ferry.node : admin key leaked"#)
        #expect(LogText.escape("a\r\nb\tc") == #"a\r\nb\tc"#)
        #expect(LogText.escape("a\u{2028}b\u{2029}c\u{85}d") == #"a\u{2028}b\u{2029}c\u{85}d"#)
    }

    @Test func terminalEscapeCodesAndInvisibleCharactersAreMadeVisible() {
        #expect(LogText.escape("\u{1B}[2J\u{1B}[31mred") == #"\u{1B}[2J\u{1B}[31mred"#)
        #expect(LogText.escape("bell\u{07}nul\u{0}del\u{7F}") == #"bell\u{7}nul\u{0}del\u{7F}"#)
        // A right-to-left override would make the rest of the line read backwards.
        #expect(LogText.escape("abc\u{202E}fed") == #"abc\u{202E}fed"#)
        #expect(LogText.escape("zero\u{200B}width") == #"zero\u{200B}width"#)
    }

    @Test func backslashesAreDoubledSoEscapesReadBackUnambiguously() {
        #expect(LogText.escape(#"C:\n"#) == #"C:\\n"#)
        #expect(LogText.escape("\\\n") == #"\\\n"#)
    }

    @Test func describingEscapesAValuesDescription() {
        struct Reason: CustomStringConvertible { var description: String { "refused\nforged" } }
        #expect(LogText.escape(describing: Reason()) == #"refused\nforged"#)
    }

    @Test func aDefaultNodeNameCarriesTheDataDirectoryUnlessItIsTheUsualOne() {
        #expect(NodeName.defaultName(host: "vm", dataDirectory: "ferry-data") == "vm")
        #expect(NodeName.defaultName(host: "vm", dataDirectory: "/var/lib/ferry/") == "vm")
        #expect(NodeName.defaultName(host: "vm", dataDirectory: "/tmp/node-b") == "vm-node-b")
        #expect(NodeName.defaultName(host: "vm", dataDirectory: "/srv/ward a/") == "vm-ward-a")
        #expect(NodeName.defaultName(host: "vm", dataDirectory: "./") == "vm")
    }
}

import Testing

@testable import FerryCore

@Suite struct NodeIDFormatTests {
    @Test func sixtyFourHexDigitsAreANodeIDInLowercase() {
        #expect(NodeIDFormat.normalized(String(repeating: "A", count: 64)) == String(repeating: "a", count: 64))
        #expect(NodeIDFormat.normalized(String(repeating: "0", count: 64)) != nil)
    }

    @Test func otherLengthsAndNonHexAreRefused() {
        #expect(NodeIDFormat.normalized(String(repeating: "a", count: 63)) == nil)
        #expect(NodeIDFormat.normalized(String(repeating: "a", count: 65)) == nil)
        #expect(NodeIDFormat.normalized(String(repeating: "g", count: 64)) == nil)
        #expect(NodeIDFormat.normalized("") == nil)
    }
}

@Suite struct PeerSourceTests {
    @Test func rawValuesAreTheNamesTheAPIShows() {
        #expect(PeerSource.allCases.map(\.rawValue) == ["config", "api", "tofu", "peer", "dns-sd", "static", "inbound", "group"])
        #expect(PeerSource(rawValue: "dns-sd") == .dnsSD)
    }
}

@Suite(.timeLimit(.minutes(1))) struct RaceTests {
    @Test func theFirstToFinishWinsAndTheOthersAreCancelled() async throws {
        let winner = try await Race.first(
            { "fast" },
            {
                try await Task.sleep(for: .seconds(600))
                return "slow"
            })
        #expect(winner == "fast")
    }

    @Test func anErrorThatComesFirstIsThrown() async {
        struct Boom: Error {}
        await #expect(throws: Boom.self) {
            try await Race.first(
                { () async throws -> Int in throw Boom() },
                {
                    try await Task.sleep(for: .seconds(600))
                    return 1
                })
        }
    }
}

import FerryTransport
import Testing

/// A peer that keeps dialling while it is not trusted is logged once a window, not per attempt.
@Suite struct RepeatedRefusalsTests {
    @Test func onlyTheFirstRefusalOfAPeerInItsWindowIsNews() {
        let refusals = RepeatedRefusals(window: .seconds(60))
        let start = ContinuousClock.now
        #expect(refusals.isNews("a", now: start))
        #expect(!refusals.isNews("a", now: start + .seconds(1)))
        #expect(!refusals.isNews("a", now: start + .seconds(59)))
        #expect(refusals.isNews("b", now: start + .seconds(59)))
        #expect(refusals.isNews("a", now: start + .seconds(61)))
        #expect(!refusals.isNews("a", now: start + .seconds(62)))
    }

    @Test func manyPeersDoNotGrowItWithoutBound() {
        let refusals = RepeatedRefusals(window: .seconds(60))
        let start = ContinuousClock.now
        for i in 0..<5000 { #expect(refusals.isNews("peer-\(i)", now: start + .seconds(Int64(i)))) }
        #expect(refusals.trackedCount <= 1024)
    }
}

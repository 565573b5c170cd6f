import FerryCore
import Testing
@testable import FerrySync

/// A transport reports every read to its connection's watchdog, for the whole life of a link.
struct ReceiveActivityTests {
    @Test func everyReadReachesTheObserverAndALongLinkStaysCheap() {
        // A 20 MB blob over a slow link is thousands of reads; a long-lived link, millions.
        let reads = Locked(0)
        let activity = ReceiveActivity()
        activity.bytesArrived()  // before any observer: ignored
        activity.observe { reads.withLock { $0 += 1 } }
        for _ in 0..<300_000 { activity.bytesArrived() }
        #expect(reads.withLock { $0 } == 300_000)
    }
}

import FerryCore
import Foundation
import Testing

@testable import FerryStore

/// The wall clock jumps under a store: revision timestamps never go backwards, in one
/// process or across a reopen, and follow the clock again once it passes them.
@Suite struct ClockJumpTests {
    @Test func timestampsKeepRisingWhenTheClockIsSetBackADayEvenAcrossAReopen() throws {
        let dir = TemporaryDirectory()
        let day: UInt64 = 86_400_000
        let wall = Locked<UInt64>(1_800_000_000_000)
        var options = StoreOptions()
        options.wallClock = { wall.withLock { $0 } }
        func stamp(_ store: DocumentStore, _ id: String) throws -> HLCTimestamp {
            let rev = try store.put(docID(id), body: ["at": .string(id)])
            return try #require(try store.revisionTree(docID(id))?.revision(rev)).hlc
        }
        var store = try DocumentStore.open(directory: dir.path, options: options)
        let before = try stamp(store, "before")
        #expect(before.millis == 1_800_000_000_000)
        wall.withLock { $0 -= day }
        let setBack = try stamp(store, "set-back")
        #expect(setBack > before)
        store = try DocumentStore.open(directory: dir.path, options: options)
        let reopened = try stamp(store, "reopened")
        #expect(reopened > setBack, "a restarted node must not reuse the hours the clock went back")
        // Set forward past the last timestamp: the clock leads again.
        wall.withLock { $0 += 2 * day }
        let forward = try stamp(store, "forward")
        #expect(forward.millis == 1_800_000_000_000 + day)
    }
}

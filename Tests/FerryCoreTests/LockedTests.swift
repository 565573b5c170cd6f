import FerryCore
import Testing

@Suite struct LockedTests {
    @Test func incrementsFromManyThreadsAreNeverLost() async {
        let counter = Locked(0)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 { group.addTask { for _ in 0..<10_000 { counter.withLock { $0 += 1 } } } }
        }
        #expect(counter.withLock { $0 } == 80_000)
    }

    struct Refused: Error, Equatable {}

    @Test func aTypedErrorThrownInsideLeavesTheLockFreeAndTheValueAsTheBodyLeftIt() {
        let list = Locked([1])
        #expect(throws: Refused.self) {
            try list.withLock { (v: inout [Int]) throws(Refused) in
                v.append(2)
                throw Refused()
            }
        }
        // Not deadlocked, and the change made before the throw stays (as with any inout).
        #expect(list.withLock { $0 } == [1, 2])
    }
}

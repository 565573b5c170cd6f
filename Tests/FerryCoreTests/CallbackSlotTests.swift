import FerryCore
import Testing

/// A callback slot's calls reach the callback set last, and stay as cheap on the
/// millionth call as on the first (a closure kept in a `Mutex` grew a thunk per call).
struct CallbackSlotTests {
    @Test func anEmptySlotCallsNothingAndALaterSetReplacesTheEarlier() {
        let slot = CallbackSlot<Int, Int>()
        #expect(slot(1) == nil)
        slot.set { $0 + 1 }
        #expect(slot(1) == 2)
        slot.set { $0 * 10 }
        #expect(slot(3) == 30)
        slot.clear()
        #expect(slot(3) == nil)
    }

    @Test func aCallbackCalledHundredsOfThousandsOfTimesDoesNotGrowTheStack() {
        // 300,000 calls: with the closure in a Mutex, a debug build overflowed its stack
        // after about 131,000 (each call had added two thunks to the chain).
        let count = Locked(0)
        let slot = CallbackSlot<Void, Void>()
        slot.set { count.withLock { $0 += 1 } }
        for _ in 0..<300_000 { slot() }
        #expect(count.withLock { $0 } == 300_000)
    }
}

/// A hybrid logical clock timestamp: 48 bits of wall-clock milliseconds and a
/// 16-bit logical counter, ordered as one 64-bit number.
public struct HLCTimestamp: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(millis: UInt64, counter: UInt16) {
        rawValue = (millis << 16) | UInt64(counter)
    }

    public static let zero = HLCTimestamp(rawValue: 0)
    public var millis: UInt64 { rawValue >> 16 }
    public var counter: UInt16 { UInt16(truncatingIfNeeded: rawValue) }
    public static func < (a: HLCTimestamp, b: HLCTimestamp) -> Bool { a.rawValue < b.rawValue }
    public var description: String { "\(millis).\(counter)" }
}

/// The hybrid logical clock state machine (Kulkarni et al.): timestamps never go
/// backwards, even if the wall clock does, and they advance past any remote
/// timestamp observed. Wall time is passed in, so the clock is pure and testable.
public struct HybridLogicalClock: Sendable {
    public private(set) var last: HLCTimestamp

    public init(last: HLCTimestamp = .zero) { self.last = last }

    /// A new timestamp for a local event at wall time `wallMillis`.
    public mutating func now(wallMillis: UInt64) -> HLCTimestamp {
        let wall = wallMillis & 0xFFFF_FFFF_FFFF
        if wall > last.millis {
            last = HLCTimestamp(millis: wall, counter: 0)
        } else {
            last = Self.increment(last)
        }
        return last
    }

    /// Merges a timestamp received from a peer, so later local events order after it.
    public mutating func observe(_ remote: HLCTimestamp, wallMillis: UInt64) {
        let wall = wallMillis & 0xFFFF_FFFF_FFFF
        let maxPhysical = max(wall, last.millis, remote.millis)
        if maxPhysical == last.millis && maxPhysical == remote.millis {
            last = HLCTimestamp(millis: maxPhysical, counter: max(last.counter, remote.counter))
        } else if maxPhysical == last.millis {
            // keep last
        } else if maxPhysical == remote.millis {
            last = remote
        } else {
            last = HLCTimestamp(millis: wall, counter: 0)
            return
        }
        last = Self.increment(last)
    }

    /// Ensures future timestamps order after `floor` (a timestamp persisted by another
    /// process), without counting as an event.
    public mutating func raise(to floor: HLCTimestamp) {
        if floor > last { last = floor }
    }

    static func increment(_ t: HLCTimestamp) -> HLCTimestamp {
        // On counter overflow, borrow a millisecond rather than wrap.
        t.counter == UInt16.max ? HLCTimestamp(millis: t.millis + 1, counter: 0)
            : HLCTimestamp(millis: t.millis, counter: t.counter + 1)
    }
}

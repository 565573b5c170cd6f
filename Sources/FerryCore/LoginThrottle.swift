import Crypto

/// Limits password guessing at every door that checks a password: an attempt must be
/// reserved before its password is evaluated and finished afterwards, and a reservation is
/// refused when the client address has used up its failures for the window or the account is
/// in its backoff; reservations in flight count as failures until they finish, so any number
/// of parallel attempts gets at most the limit evaluated.
public final class LoginThrottle: Sendable {
    /// The limits; every field has a documented default.
    public struct Policy: Sendable, Equatable {
        /// Failed (or unfinished) attempts one client address may make within `window`. Default 10.
        public var maxFailuresPerAddress = 10
        /// The sliding window of the per-address count. Default 60 s.
        public var window: Duration = .seconds(60)
        /// Consecutive failures of one account, from any address, before it backs off. Default 5.
        public var accountFailuresBeforeBackoff = 5
        /// The first backoff; each further failure doubles it. Default 1 s.
        public var initialBackoff: Duration = .seconds(1)
        /// The longest backoff: an account is never locked for longer, so an attacker can
        /// slow a user down but never lock them out for good. Default 5 min.
        public var maximumBackoff: Duration = .seconds(300)
        /// An account's failures are forgotten after this long without another. Default 15 min.
        public var accountMemory: Duration = .seconds(900)
        /// How long an address that logged in to an account stays exempt from that account's
        /// backoff (its failures still count, and its own address limit still applies), so a
        /// stranger's guesses cannot lock out a user from where they already logged in. Default 24 h.
        public var knownAddressMemory: Duration = .seconds(86_400)
        /// Addresses, accounts and known pairs each tracked at most; idle entries go first. Default 10,000.
        public var maxTracked = 10_000
        /// How often at most `onSummary` reports. Default 60 s.
        public var summaryInterval: Duration = .seconds(60)

        public init() {}
    }

    /// Why a reservation was refused, and when trying again makes sense.
    public struct Refusal: Sendable, Equatable, Error {
        public enum Scope: Sendable, Equatable {
            /// The client address used up its failures for the window.
            case address
            /// The account is backing off after consecutive failures.
            case account
        }
        public let scope: Scope
        public let retryAfter: Duration
    }

    /// A reserved attempt: finish it exactly once with the outcome of the check.
    public struct Attempt: Sendable, Hashable {
        let id: UInt64
        let address: String
        let account: String
    }

    /// Failures counted since the last summary.
    public struct Summary: Sendable, Equatable {
        public let failures: Int
        public let refusals: Int
        public let addresses: Int
        public let latestAddress: String
    }

    private struct AddressState {
        var failures: [Duration] = []
        var inFlight = 0
    }

    private struct AccountState {
        var failures = 0
        var inFlight = 0
        var lastFailure: Duration = .zero
        var lockedUntil: Duration = .zero
    }

    private struct State {
        var addresses: [String: AddressState] = [:]
        var accounts: [String: AccountState] = [:]
        /// "account\0address" of successful logins, until when they are known.
        var known: [String: Duration] = [:]
        var inFlight: [UInt64: (address: String, account: String)] = [:]
        var nextID: UInt64 = 1
        var lastSummary: Duration?
        var unreported = 0
        var unreportedRefusals = 0
        var unreportedAddresses: Set<String> = []
    }

    public let policy: Policy
    private let elapsed: @Sendable () -> Duration
    private let onSummary: @Sendable (Summary) -> Void
    private let state = Locked(State())

    /// A throttle reading time from `clock` (inject a manual clock in tests); `onSummary`
    /// hears of failures at most once per `policy.summaryInterval` (never a password).
    public init(
        policy: Policy = Policy(), clock: any Clock<Duration> = ContinuousClock(), onSummary: @escaping @Sendable (Summary) -> Void = { _ in }
    ) {
        self.policy = policy
        self.elapsed = Self.stopwatch(clock)
        self.onSummary = onSummary
    }

    private static func stopwatch<C: Clock<Duration>>(_ clock: C) -> @Sendable () -> Duration {
        let start = clock.now
        return { start.duration(to: clock.now) }
    }

    /// Reserves one attempt for `account` from `address`, before its password is evaluated.
    /// Until it is finished it counts as a failure against both.
    public func reserve(account: String, address: String) -> Result<Attempt, Refusal> {
        let now = elapsed()
        let account = Self.bounded(account)
        let result = state.withLock { s -> Result<Attempt, Refusal> in
            if let refusal = Self.refusal(&s, account: account, address: address, now: now, policy: policy, countInFlight: true) {
                s.unreportedRefusals += 1
                return .failure(refusal)
            }
            Self.makeRoom(&s, now: now, policy: policy)
            s.addresses[address, default: AddressState()].inFlight += 1
            s.accounts[account, default: AccountState()].inFlight += 1
            let id = s.nextID
            s.nextID += 1
            s.inFlight[id] = (address, account)
            return .success(Attempt(id: id, address: address, account: account))
        }
        return result
    }

    /// Whether an attempt would be refused now by failures already recorded (attempts in
    /// flight aside): for credentials that are known good without evaluating them again
    /// (a remembered verification), which must still not answer while the throttle refuses.
    public func check(account: String, address: String) -> Refusal? {
        let now = elapsed()
        let account = Self.bounded(account)
        return state.withLock { s in
            Self.refusal(&s, account: account, address: address, now: now, policy: policy, countInFlight: false)
        }
    }

    /// Finishes a reserved attempt. A failure counts against the address for the window and
    /// against the account (backing it off past the threshold); a success clears the
    /// account's failures and remembers the address as the account's.
    public func finish(_ attempt: Attempt, succeeded: Bool) {
        let now = elapsed()
        let summary = state.withLock { s -> Summary? in
            guard let entry = s.inFlight.removeValue(forKey: attempt.id) else { return nil }
            s.addresses[entry.address]?.inFlight -= 1
            s.accounts[entry.account]?.inFlight -= 1
            if succeeded {
                if var a = s.accounts[entry.account] {
                    a.failures = 0
                    a.lockedUntil = .zero
                    s.accounts[entry.account] = a
                }
                s.known[entry.account + "\u{0}" + entry.address] = now + policy.knownAddressMemory
                return nil
            }
            s.addresses[entry.address, default: AddressState()].failures.append(now)
            var a = s.accounts[entry.account, default: AccountState()]
            if now - a.lastFailure > policy.accountMemory { a.failures = 0 }
            a.failures += 1
            a.lastFailure = now
            if a.failures >= policy.accountFailuresBeforeBackoff {
                a.lockedUntil = now + Self.backoff(failures: a.failures, policy: policy)
            }
            s.accounts[entry.account] = a
            s.unreported += 1
            s.unreportedAddresses.insert(entry.address)
            if let last = s.lastSummary, now - last < policy.summaryInterval { return nil }
            let summary = Summary(
                failures: s.unreported, refusals: s.unreportedRefusals, addresses: s.unreportedAddresses.count, latestAddress: entry.address)
            s.lastSummary = now
            s.unreported = 0
            s.unreportedRefusals = 0
            s.unreportedAddresses = []
            return summary
        }
        if let summary { onSummary(summary) }
    }

    /// The backoff after `failures` consecutive failures of an account: the initial backoff
    /// doubled for each failure past the threshold, never more than the maximum.
    public static func backoff(failures: Int, policy: Policy) -> Duration {
        let steps = max(0, failures - policy.accountFailuresBeforeBackoff)
        var d = policy.initialBackoff
        for _ in 0..<min(steps, 40) where d < policy.maximumBackoff { d *= 2 }
        return min(d, policy.maximumBackoff)
    }

    /// Compares two secrets in time that depends on neither their contents nor their
    /// lengths (both are hashed first).
    public static func constantTimeEquals(_ a: some Sequence<UInt8>, _ b: some Sequence<UInt8>) -> Bool {
        let x = Array(SHA256.hash(data: Array(a))), y = Array(SHA256.hash(data: Array(b)))
        var difference: UInt8 = 0
        for (p, q) in zip(x, y) { difference |= p ^ q }
        return difference == 0
    }

    private static func bounded(_ account: String) -> String {
        account.utf8.count <= 256 ? account : "sha256:" + Hex.encode(Array(SHA256.hash(data: Array(account.utf8))))
    }

    private static func isKnown(_ s: State, account: String, address: String, now: Duration) -> Bool {
        (s.known[account + "\u{0}" + address]).map { $0 > now } ?? false
    }

    private static func refusal(
        _ s: inout State, account: String, address: String, now: Duration, policy: Policy, countInFlight: Bool
    ) -> Refusal? {
        if var a = s.addresses[address] {
            a.failures.removeAll { now - $0 >= policy.window }
            s.addresses[address] = a
            let used = a.failures.count + (countInFlight ? a.inFlight : 0)
            if used >= policy.maxFailuresPerAddress {
                let retry = a.failures.first.map { policy.window - (now - $0) } ?? .seconds(1)
                return Refusal(scope: .address, retryAfter: max(retry, .seconds(1)))
            }
        }
        guard !isKnown(s, account: account, address: address, now: now), let a = s.accounts[account] else { return nil }
        if now < a.lockedUntil { return Refusal(scope: .account, retryAfter: a.lockedUntil - now) }
        guard countInFlight else { return nil }
        let failures = now - a.lastFailure > policy.accountMemory ? 0 : a.failures
        // Below the threshold the remaining tries may run at once; past it, one at a time.
        let allowed = max(policy.accountFailuresBeforeBackoff, failures + 1)
        if failures + a.inFlight >= allowed { return Refusal(scope: .account, retryAfter: policy.initialBackoff) }
        return nil
    }

    /// Keeps the tables bounded: forgets idle entries, then (if still full) the oldest.
    private static func makeRoom(_ s: inout State, now: Duration, policy: Policy) {
        if s.addresses.count >= policy.maxTracked {
            s.addresses = s.addresses.filter { $0.value.inFlight > 0 || $0.value.failures.contains { now - $0 < policy.window } }
            while s.addresses.count >= policy.maxTracked, let victim = s.addresses.first(where: { $0.value.inFlight == 0 })?.key {
                s.addresses[victim] = nil
            }
        }
        if s.accounts.count >= policy.maxTracked {
            s.accounts = s.accounts.filter { $0.value.inFlight > 0 || (now < $0.value.lockedUntil || now - $0.value.lastFailure <= policy.accountMemory) }
            while s.accounts.count >= policy.maxTracked, let victim = s.accounts.min(by: { $0.value.lockedUntil < $1.value.lockedUntil })?.key {
                if s.accounts[victim]!.inFlight > 0 { break }
                s.accounts[victim] = nil
            }
        }
        if s.known.count >= policy.maxTracked {
            s.known = s.known.filter { $0.value > now }
            if s.known.count >= policy.maxTracked { s.known.removeAll() }
        }
    }
}

import FerryCore
import FerryCouchDocuments
import Foundation
import Logging
import NIOPosix

extension LoginThrottle {
    /// The CouchDB API's throttle: the default policy, failures summarised to `logger` at
    /// most once a minute (counts and an address, never a name's password).
    public static func couch(logger: Logger, policy: Policy = Policy(), clock: any Clock<Duration> = ContinuousClock()) -> LoginThrottle {
        LoginThrottle(policy: policy, clock: clock) { summary in
            logger.warning(
                "failed CouchDB API logins",
                metadata: [
                    "failures": "\(summary.failures)", "refused": "\(summary.refusals)", "addresses": "\(summary.addresses)",
                    "latest": "\(summary.latestAddress)",
                ])
        }
    }
}

// Every password the CouchDB API checks (HTTP Basic, Bearer admin key, `POST /_session`)
// goes through `login`, under the shared `LoginThrottle`.
extension CouchFrontDoor {
    /// The principal a name and password (or the admin key) prove: 429 while the throttle
    /// refuses the address or the account, 401 when wrong. An attempt is reserved before the
    /// password is evaluated, so parallel guesses beyond the limit are never evaluated.
    func login(name: String, password: String, address: String, now: Date, bearer: Bool = false) async throws(CouchError) -> CouchPrincipal {
        let throttle = access.throttle
        if name == "admin" {
            let attempt = try Self.reserve(throttle, account: name, address: address)
            let matches = acceptsAdminKey && (access.adminKey?(password) ?? false)
            throttle.finish(attempt, succeeded: matches)
            guard matches else {
                if !acceptsAdminKey {
                    throw .unauthorized("The admin key is accepted only on the loopback listener; log in as a configured user.")
                }
                throw .unauthorized(bearer ? "The admin key is incorrect." : "Name or password is incorrect.")
            }
            return .admin
        }
        // A pair verified moments ago (HTTP Basic sends it with every request) needs no new
        // evaluation, but is still refused while the throttle refuses.
        if let user = access.users.remembered(name: name, password: password, now: now) {
            if let refusal = throttle.check(account: name, address: address) { throw Self.throttled(refusal) }
            return .user(name: user.name, policy: access.users.policy(of: user))
        }
        let attempt = try Self.reserve(throttle, account: name, address: address)
        let user = await verify(name: name, password: password, now: now)
        throttle.finish(attempt, succeeded: user != nil)
        guard let user else { throw .unauthorized("Name or password is incorrect.") }
        return .user(name: user.name, policy: access.users.policy(of: user))
    }

    static func reserve(_ throttle: LoginThrottle, account: String, address: String) throws(CouchError) -> LoginThrottle.Attempt {
        switch throttle.reserve(account: account, address: address) {
        case .success(let attempt): return attempt
        case .failure(let refusal): throw throttled(refusal)
        }
    }

    /// 429 with when to try again.
    static func throttled(_ refusal: LoginThrottle.Refusal) -> CouchError {
        let seconds = max(1, Int(refusal.retryAfter.components.seconds) + (refusal.retryAfter.components.attoseconds > 0 ? 1 : 0))
        let why = refusal.scope == .address ? "Too many failed logins from this address" : "Too many failed logins for this name"
        return CouchError(.tooManyRequests, "too_many_requests", "\(why); try again in \(seconds) s.")
    }

    /// PBKDF2 off Swift's cooperative threads: it takes tens to hundreds of milliseconds.
    func verify(name: String, password: String, now: Date) async -> CouchUser? {
        let users = access.users
        let user = try? await NIOThreadPool.singleton.runIfActive { users.authenticate(name: name, password: password, now: now) }
        return user ?? nil
    }
}

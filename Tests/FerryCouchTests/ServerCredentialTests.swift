import FerryCore
import FerrySync
import Foundation
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// Password hashes, user names, session cookies, web origins and the login throttle.
@Suite struct ServerCredentialTests {
    @Test func aPasswordHashVerifiesItsPasswordAndNoOther() throws {
        let hash = try CouchPasswordHash(password: "correct horse", iterations: 10_000)
        #expect(hash.verify("correct horse"))
        #expect(!hash.verify("correct hors"))
        #expect(!hash.verify(""))
        let again = try CouchPasswordHash(parsing: hash.description)
        #expect(again == hash && again.verify("correct horse"))
        // A fresh salt each time: the same password never hashes the same.
        #expect(try CouchPasswordHash(password: "correct horse", iterations: 10_000).description != hash.description)
    }

    @Test func malformedPasswordHashesAreRefusedWithTheirReason() throws {
        let good = try CouchPasswordHash(password: "p", iterations: 10_000).description
        let parts = good.split(separator: "$").map(String.init)
        let cases: [(String, String)] = [
            ("", "must be pbkdf2-sha256$"),
            ("sha1$10000$\(parts[2])$\(parts[3])", "must be pbkdf2-sha256$"),
            ("pbkdf2-sha256$9999$\(parts[2])$\(parts[3])", "iterations"),
            ("pbkdf2-sha256$ten$\(parts[2])$\(parts[3])", "iterations"),
            ("pbkdf2-sha256$10000$c2FsdA==$\(parts[3])", "salt"),
            ("pbkdf2-sha256$10000$\(parts[2])$c2hvcnQ=", "hash"),
            ("pbkdf2-sha256$10000$\(parts[2])$!!!", "hash"),
            ("pbkdf2-sha256$10000$\(parts[2])", "must be pbkdf2-sha256$"),
        ]
        for (text, reason) in cases {
            #expect {
                try CouchPasswordHash(parsing: text)
            } throws: { error in
                (error as? CouchUserError)?.description.contains(reason) == true
            }
        }
        #expect(throws: CouchUserError.self) { try CouchPasswordHash(password: "p", iterations: 100) }
    }

    @Test func userNamesThatBasicAuthCannotCarryOrThatAreReservedAreRefused() {
        #expect(CouchUser.nameProblem("tablet") == nil)
        #expect(CouchUser.nameProblem("ana.lópez") == nil)
        for bad in ["", "a:b", "admin", "_users", "tab\t", "x\u{202E}"] { #expect(CouchUser.nameProblem(bad) != nil, "\(bad)") }
    }

    @Test func theUserTableAuthenticatesOnlyTheRightNameAndPassword() throws {
        let table = CouchUserTable([CouchUser(name: "tablet", password: try CouchPasswordHash(password: "s3cret", iterations: 10_000))])
        let now = Date()
        #expect(table.authenticate(name: "tablet", password: "s3cret", now: now)?.name == "tablet")
        // Remembered, still checked.
        #expect(table.authenticate(name: "tablet", password: "s3cret", now: now)?.name == "tablet")
        #expect(table.authenticate(name: "tablet", password: "s3cre", now: now) == nil)
        #expect(table.authenticate(name: "nobody", password: "s3cret", now: now) == nil)
    }

    @Test func aSessionCookieNamesItsUserUntilItExpires() {
        let cookies = CouchSessionCookies(secret: Array(repeating: 7, count: 32), lifetime: 600)
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let value = cookies.issue(name: "tablet", credential: "hash-1", listener: .loopback, now: start)
        let credential: (String) -> String? = { $0 == "tablet" ? "hash-1" : nil }
        #expect(cookies.verify(value, listener: .loopback, credential: credential, now: start.addingTimeInterval(10))?.name == "tablet")
        #expect(cookies.verify(value, listener: .loopback, credential: credential, now: start.addingTimeInterval(601)) == nil)
        // Renewed once less than 90 % of its lifetime is left.
        let expires = start.addingTimeInterval(600)
        #expect(!cookies.needsRenewal(expires: expires, now: start.addingTimeInterval(30)))
        #expect(cookies.needsRenewal(expires: expires, now: start.addingTimeInterval(61)))
    }

    @Test func aForgedOrStaleCredentialCookieIsRefused() {
        let cookies = CouchSessionCookies(secret: Array(repeating: 7, count: 32))
        let now = Date()
        let value = cookies.issue(name: "tablet", credential: "hash-1", listener: .loopback, now: now)
        // The password changed: its sessions end.
        #expect(cookies.verify(value, listener: .loopback, credential: { _ in "hash-2" }, now: now) == nil)
        // Another node's secret.
        let other = CouchSessionCookies(secret: Array(repeating: 8, count: 32))
        #expect(other.verify(value, listener: .loopback, credential: { _ in "hash-1" }, now: now) == nil)
        // A changed name or expiry breaks the mac.
        let token = String(decoding: CouchSessionCookies.base64urlDecode(value)!, as: UTF8.self)
        let renamed = CouchSessionCookies.base64url(Array(token.replacingOccurrences(of: "tablet", with: "admin").utf8))
        #expect(cookies.verify(renamed, listener: .loopback, credential: { _ in "hash-1" }, now: now) == nil)
        for junk in ["", "!!", "YQ", CouchSessionCookies.base64url(Array("a:b".utf8))] {
            #expect(cookies.verify(junk, listener: .loopback, credential: { _ in "hash-1" }, now: now) == nil)
        }
    }

    @Test func theSessionCookieIsFoundAmongOtherCookies() {
        #expect(CouchSessionCookies.cookie(in: ["theme=dark; AuthSession=abc; x=1"]) == "abc")
        #expect(CouchSessionCookies.cookie(in: ["a=1", "AuthSession=\"q\""]) == "q")
        #expect(CouchSessionCookies.cookie(in: ["AuthSession="]) == nil)
        #expect(CouchSessionCookies.cookie(in: ["XAuthSession=abc"]) == nil)
    }

    @Test func onlyListedOriginsGetCredentialsAndStarOnlyWithout() {
        let listed = CouchCORSPolicy(origins: ["https://app.example:8443/"])
        #expect(listed.decide(origin: nil, carriesCredentials: true) == .noOrigin)
        #expect(listed.decide(origin: "https://APP.example:8443", carriesCredentials: true) == .allowed(origin: "https://APP.example:8443", credentials: true))
        guard case .refused = listed.decide(origin: "https://evil.example", carriesCredentials: false) else {
            Issue.record("an unlisted origin was allowed")
            return
        }
        let star = CouchCORSPolicy(origins: ["*"])
        #expect(star.decide(origin: "https://any.example", carriesCredentials: false) == .allowed(origin: "*", credentials: false))
        guard case .refused = star.decide(origin: "https://any.example", carriesCredentials: true) else {
            Issue.record("* let credentials through")
            return
        }
    }

    @Test func aPreflightNamesWhatMayBeSentAndRefusesOtherHeaders() throws {
        let cors = CouchCORSPolicy(origins: ["https://app.example"])
        let ok = try cors.preflight(origin: "https://app.example", credentials: true, method: "PUT", headers: "Content-Type, Authorization").get()
        #expect(ok[.accessControlAllowOrigin] == "https://app.example")
        #expect(ok[.accessControlAllowCredentials] == "true")
        #expect(ok[.accessControlAllowMethods]?.contains("PUT") == true)
        #expect(ok[.accessControlAllowHeaders]?.contains("authorization") == true)
        #expect(throws: CouchError.self) { try cors.preflight(origin: "https://app.example", credentials: true, method: "PUT", headers: "X-Evil").get() }
        #expect(throws: CouchError.self) { try cors.preflight(origin: "https://app.example", credentials: true, method: "TRACE", headers: nil).get() }
    }

    @Test func basicCredentialsAndThePresentedAdminKeyAreReadExactly() {
        let encoded = Data("tablet:pa:ss word".utf8).base64EncodedString()
        #expect(HTTPRequestRules.basicCredentials("Basic \(encoded)")! == ("tablet", "pa:ss word"))
        #expect(HTTPRequestRules.basicCredentials("basic  \(encoded)")! == ("tablet", "pa:ss word"))
        #expect(HTTPRequestRules.basicCredentials("Basic " + Data("nocolon".utf8).base64EncodedString()) == nil)
        #expect(HTTPRequestRules.basicCredentials("Basic !!!") == nil)
        #expect(HTTPRequestRules.basicCredentials("Bearer \(encoded)") == nil)
        #expect(HTTPRequestRules.presentedAdminKey("Bearer KEY") == "KEY")
        #expect(HTTPRequestRules.presentedAdminKey("Basic " + Data("admin:KEY".utf8).base64EncodedString()) == "KEY")
        #expect(HTTPRequestRules.presentedAdminKey("Basic " + Data("tablet:KEY".utf8).base64EncodedString()) == nil)
        #expect(HTTPRequestRules.presentedAdminKey(nil) == nil)
    }

    @Test func aCookieFromOneListenerIsRefusedOnTheOther() {
        let cookies = CouchSessionCookies(secret: Array(repeating: 7, count: 32))
        let now = Date()
        let credential: (String) -> String? = { _ in "hash-1" }
        let lan = cookies.issue(name: "tablet", credential: "hash-1", listener: .lan, now: now)
        let loopback = cookies.issue(name: "tablet", credential: "hash-1", listener: .loopback, now: now)
        #expect(cookies.verify(lan, listener: .lan, credential: credential, now: now)?.name == "tablet")
        #expect(cookies.verify(lan, listener: .loopback, credential: credential, now: now) == nil)
        #expect(cookies.verify(loopback, listener: .loopback, credential: credential, now: now)?.name == "tablet")
        #expect(cookies.verify(loopback, listener: .lan, credential: credential, now: now) == nil)
    }
}

import FerryCore
import FerrySync
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


@Suite struct CouchEndpointTests {
    @Test func parsesHostPortDatabaseAndPercentEncodedCredentials() throws {
        let e = try CouchEndpoint.parse("https://al%40ice:p%3Ass%2Fw@db.example:6984/my%2Fdb")
        #expect(e.scheme == "https")
        #expect(e.host == "db.example")
        #expect(e.port == 6984)
        #expect(e.database == "my/db")
        #expect(e.credentials == CouchCredentials(user: "al@ice", password: "p:ss/w"))
    }

    @Test func defaultsThePortByScheme() throws {
        #expect(try CouchEndpoint.parse("http://h/db").port == 80)
        #expect(try CouchEndpoint.parse("HTTPS://h/db").port == 443)
    }

    @Test func escapesTheDatabaseNameAsOnePathSegment() async throws {
        let e = try CouchEndpoint.parse("http://127.0.0.1:5984/a%2Fb%2Bc")
        #expect(e.database == "a/b+c")
        #expect(e.redacted == "http://127.0.0.1:5984/a%2Fb%2Bc")
        let http = CouchHTTP(endpoint: e, tls: nil, logger: .init(label: "t"))
        #expect(http.databasePath("_changes") == "/a%2Fb%2Bc/_changes")
        await http.shutdown()
    }

    @Test func documentPathsKeepTheDesignAndLocalSlash() {
        #expect(CouchRemote.documentSuffix("_design/app") == "_design/app")
        #expect(CouchRemote.documentSuffix("a/b c") == "a%2Fb%20c")
        #expect(CouchRemote.documentSuffix("_local/x") == "_local/x")
    }

    @Test func keepsIPv6HostsBracketedInURLs() throws {
        let e = try CouchEndpoint.parse("http://[::1]:5984/db")
        #expect(e.host == "::1")
        #expect(e.serverURL == "http://[::1]:5984")
    }

    @Test(arguments: [
        "ftp://h/db", "http://", "http://h", "http://h/", "http://h/a/b", "http://h/db?x=1", "http://h/db#f", "not a url",
    ])
    func refusesURLsThatNameNoDatabase(_ text: String) {
        #expect(throws: CouchClientError.self) { try CouchEndpoint.parse(text) }
    }

    @Test func aRefusedURLsErrorHidesItsPassword() {
        do {
            _ = try CouchEndpoint.parse("http://u:secret@h/a/b")
            Issue.record("parsed")
        } catch {
            #expect(!error.message.contains("secret"))
            #expect(error.code == "bad_endpoint")
            #expect(!error.isTransient)
        }
    }

    @Test func redactionNeverShowsThePassword() throws {
        let e = try CouchEndpoint.parse("http://u:secret@h:1/db")
        #expect(!e.redacted.contains("secret"))
        #expect(!e.description.contains("secret"))
        #expect(!"\(e.credentials!)".contains("secret"))
        #expect(CouchEndpoint.redact("http://u:secret@h:1/db") == "http://u:***@h:1/db")
    }

    @Test func credentialsComeFromTheFirstLineOfAFileOrAVariable() throws {
        #expect(try CouchCredentials.parse("bob:pa:ss\r\nignored", source: "x") == CouchCredentials(user: "bob", password: "pa:ss"))
        #expect(throws: CouchClientError.self) { try CouchCredentials.parse("nocolon", source: "x") }
        #expect(throws: CouchClientError.self) { try CouchCredentials.parse(":pw", source: "x") }
        #expect(throws: CouchClientError.self) { try CouchCredentials.fromFile("/nonexistent/credentials") }
        #expect(throws: CouchClientError.self) { try CouchCredentials.fromEnvironment("FERRY_TEST_UNSET_VARIABLE_XYZ") }
    }

    @Test func theRemoteDatabaseIDSurvivesAnAddressChangeWhenTheServerHasAUUID() throws {
        let a = try CouchEndpoint.parse("http://10.0.0.1:5984/db")
        let b = try CouchEndpoint.parse("http://hub.example:5984/db")
        #expect(CouchRemote.databaseID(endpoint: a, serverUUID: "u1") == CouchRemote.databaseID(endpoint: b, serverUUID: "u1"))
        #expect(CouchRemote.databaseID(endpoint: a, serverUUID: nil) != CouchRemote.databaseID(endpoint: b, serverUUID: nil))
    }

    @Test func sinceIsSentAsTheServerWroteIt() {
        #expect(CouchRemote.sinceText(.start) == "0")
        #expect(CouchRemote.sinceText(RemoteSequenceForTests.opaque("12-g1AAAA")) == "12-g1AAAA")
    }

    @Test func aPinIsTakenInHexWithOrWithoutColons() throws {
        let hex = String(repeating: "ab", count: 32)
        #expect(try CouchEndpoint.normalizedPin(hex.uppercased()) == hex)
        let colons = (0..<32).map { _ in "AB" }.joined(separator: ":")
        #expect(try CouchEndpoint.normalizedPin("sha256 Fingerprint=" + colons) == hex)
        #expect(throws: CouchClientError.self) { try CouchEndpoint.normalizedPin("abc") }
        #expect(throws: CouchClientError.self) { try CouchEndpoint.normalizedPin(String(repeating: "g", count: 64)) }
    }
}

/// Sequences as CouchDB writes them.
enum RemoteSequenceForTests {
    static func opaque(_ s: String) -> FerrySync.RemoteSequence { .init(.string(s)) }
}

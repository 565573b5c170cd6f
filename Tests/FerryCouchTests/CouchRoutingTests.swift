import FerryCouch
import Testing

@Suite struct CouchRoutingTests {
    @Test func pathsNameTheirEndpoints() {
        #expect(CouchRouting.endpoint(rawPath: "/") == .welcome)
        #expect(CouchRouting.endpoint(rawPath: "/_up") == .up)
        #expect(CouchRouting.endpoint(rawPath: "/db") == .database("db"))
        #expect(CouchRouting.endpoint(rawPath: "/db/") == .database("db"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_changes") == .databaseSpecial(db: "db", name: "changes"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_local/a/b") == .localDocument(db: "db", id: "a/b"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_design/x") == .document(db: "db", id: "_design/x"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_design/x/a.txt") == .attachment(db: "db", docID: "_design/x", name: "a.txt"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_design%2Fx") == .document(db: "db", id: "_design/x"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_design%2Fx/a.txt") == .attachment(db: "db", docID: "_design/x", name: "a.txt"))
        #expect(CouchRouting.endpoint(rawPath: "/db/a%2Fb") == .document(db: "db", id: "a/b"))
        #expect(CouchRouting.endpoint(rawPath: "/db/doc/dir/f.txt") == .attachment(db: "db", docID: "doc", name: "dir/f.txt"))
        #expect(CouchRouting.endpoint(rawPath: "/_utils") == .unknownServer("_utils"))
        #expect(CouchRouting.endpoint(rawPath: "/db/%zz") == nil)
    }
}

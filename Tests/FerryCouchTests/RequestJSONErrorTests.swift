import FerryCore
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// JSON the API refuses is CouchDB's `400 bad_request`, whose reason says what the parser
/// found wrong and where, on every route that reads a JSON body or a JSON query option.
@Suite struct RequestJSONErrorTests {
    /// Bodies the parser refuses, each with the words its reason must hold.
    static let refused: [(body: [UInt8], reason: String)] = [
        (Array(("{\"a\":" + String(repeating: "[", count: 300) + String(repeating: "]", count: 300) + "}").utf8),
         "nesting deeper than \(JSON.maximumDepth) levels"),
        (Array(#"{"n":1e400}"#.utf8), "number out of range"),
        (Array(#"{"x":1,"x":2}"#.utf8), #"duplicate key "x""#),
        ([UInt8](#"{""#.utf8) + [0xFF] + Array(#"":1}"#.utf8), "invalid UTF-8 in string"),
        (Array(#"{"a":}"#.utf8), "line 1, column 6: unexpected '}'"),
    ]

    @Test func aRefusedJSONBodyIsABadRequestNamingTheParsersReason() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            for (body, reason) in Self.refused {
                let json: HTTPFields = [.contentType: "application/json"]
                let related: HTTPFields = [.contentType: "multipart/related; boundary=\"b\""]
                let multipart = Multipart.write([([("Content-Type", "application/json")], body)], boundary: "b")
                let answers = [
                    ("PUT /{db}/{id}", try await c.send(.put, "/ferry/doc", headers: json, bytes: body)),
                    ("POST /{db}", try await c.send(.post, "/ferry", headers: json, bytes: body)),
                    ("_bulk_docs", try await c.send(.post, "/ferry/_bulk_docs", headers: json, bytes: body)),
                    ("_all_docs", try await c.send(.post, "/ferry/_all_docs", headers: json, bytes: body)),
                    ("_local", try await c.send(.put, "/ferry/_local/cp", headers: json, bytes: body)),
                    ("multipart/related", try await c.send(.put, "/ferry/doc", headers: related, bytes: multipart)),
                ]
                for (route, answer) in answers {
                    #expect(answer.status == .badRequest, "\(route): \(answer.text)")
                    #expect(answer.json["error"] == "bad_request", "\(route): \(answer.text)")
                    let said = answer.json["reason"]?.stringValue ?? ""
                    #expect(said.contains(reason), "\(route) said \(said), not \(reason)")
                    // What is wrong with valid UTF-8 is not called invalid UTF-8.
                    #expect(said.contains("UTF-8") == reason.contains("UTF-8"), "\(route): \(said)")
                }
            }
        }
    }

    @Test func aRefusedJSONQueryOptionNamesTheOptionAndTheReason() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let answer = try await c.get("/ferry/_all_docs?keys=%5B1e400%5D")
            #expect(answer.status == .badRequest)
            let said = answer.json["reason"]?.stringValue ?? ""
            #expect(said.contains("`keys`") && said.contains("number out of range"), "\(said)")
        }
    }

    @Test func aHugeDuplicateKeyIsNotEchoedWhole() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let key = String(repeating: "k", count: 10_000)
            let answer = try await c.send(
                .put, "/ferry/doc", headers: [.contentType: "application/json"], bytes: Array("{\"\(key)\":1,\"\(key)\":2}".utf8))
            #expect(answer.status == .badRequest)
            let said = answer.json["reason"]?.stringValue ?? ""
            #expect(said.contains("duplicate key") && said.count <= CouchError.maxJSONReasonLength + 1, "\(said.count)")
        }
    }
}

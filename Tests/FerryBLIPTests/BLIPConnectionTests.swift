import FerryCore
import Testing

@testable import FerryBLIP

@Suite struct BLIPConnectionTests {
    /// Moves every ready WebSocket message from `from` to `to`; returns the messages `to` completed.
    func deliver(_ from: inout BLIPConnection, _ to: inout BLIPConnection) throws -> [BLIPMessage] {
        var out: [BLIPMessage] = []
        while let bytes = try from.nextOutgoing() {
            if let m = try to.receive(bytes) { out.append(m) }
        }
        return out
    }

    @Test func aLongCompressedRequestCrossesTheWindowWithAcksAndIsAnswered() throws {
        var client = BLIPConnection()
        var server = BLIPConnection()
        // Incompressible, so that the wire bytes pass the 128,000-byte window.
        var rng = SeededGenerator(seed: 7)
        let body = (0..<400_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let number = try client.send(.request("rev", [("id", "doc-1")], body: body, flags: [.compressed]))
        #expect(number == 1)
        var received: [BLIPMessage] = []
        var rounds = 0
        while received.isEmpty {
            rounds += 1
            #expect(rounds < 100, "the message never completed")
            if rounds >= 100 { return }
            received += try deliver(&client, &server)
            _ = try deliver(&server, &client)  // the server's ACKs release the client's frames
        }
        #expect(rounds > 1, "the sender waited for an acknowledgement")
        let request = try #require(received.first)
        #expect(request.profile == "rev" && request["id"] == "doc-1" && request.body == body)
        try server.respond(to: request, properties: [("ok", "1")])
        let reply = try #require(try deliver(&server, &client).first)
        #expect(reply.type == .response && reply.number == 1 && reply["ok"] == "1")
    }

    @Test func anErrorReplyCarriesDomainCodeAndMessageAndANoReplyRequestGetsNone() throws {
        var client = BLIPConnection()
        var server = BLIPConnection()
        try client.send(.request("nonsense"))
        try client.send(.request("norev", flags: [.noReply]))
        let requests = try deliver(&client, &server)
        #expect(requests.map(\.profile) == ["nonsense", "norev"])
        try server.fail(requests[0], domain: "BLIP", code: 404, message: "no handler for message")
        try server.fail(requests[1], domain: "BLIP", code: 404, message: "never sent")
        let replies = try deliver(&server, &client)
        #expect(replies.count == 1)
        let error = try #require(replies.first?.error)
        #expect(error.domain == "BLIP" && error.code == 404 && error.message == "no handler for message")
    }

    @Test func bytesThatAreNoFrameFailTheConnection() throws {
        var server = BLIPConnection()
        #expect(throws: BLIPError.self) { _ = try server.receive([0x01]) }
    }
}

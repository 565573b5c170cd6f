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

/// A body read a slice at a time, counting the bytes read.
final class CountingSource: BLIPBodySource, @unchecked Sendable {
    let bytes: [UInt8]
    var largestRead = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var length: Int { bytes.count }
    func read(offset: Int, count: Int) throws(BLIPError) -> [UInt8] {
        largestRead = max(largestRead, count)
        return Array(bytes[offset..<(offset + count)])
    }
}

@Suite struct BLIPStreamedReplyTests {
    @Test func aReplyLargerThanAMessageIsSentAndReceivedAFrameAtATime() throws {
        var client = BLIPConnection(maxMessageSize: 1 << 20)
        var server = BLIPConnection()
        var rng = SeededGenerator(seed: 11)
        let blob = (0..<3_000_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let number = try client.send(.request("getAttachment", [("digest", "sha1-x")]), streamingReply: true)
        var requests: [BLIPMessage] = []
        while let bytes = try client.nextOutgoing() { if let m = try server.receive(bytes) { requests.append(m) } }
        let request = try #require(requests.first)
        let source = CountingSource(blob)
        try server.respond(to: request, properties: [("Content-Type", "image/jpeg")], body: source)
        var head: BLIPMessage?
        var body: [UInt8] = []
        var largestPart = 0
        var ended = false
        var rounds = 0
        while !ended {
            rounds += 1
            #expect(rounds < 1000, "the reply never ended")
            if rounds >= 1000 { return }
            while let bytes = try server.nextOutgoing() {
                guard let received = try client.receiveAny(bytes) else { continue }
                guard case .part(let part) = received else {
                    Issue.record("a streamed reply came whole")
                    return
                }
                #expect(part.number == number)
                if let h = part.head {
                    #expect(head == nil, "the head comes once")
                    head = h
                }
                #expect(head != nil, "the head comes first")
                body += part.body
                largestPart = max(largestPart, part.body.count)
                ended = part.isLast
            }
            while let bytes = try client.nextOutgoing() { _ = try server.receive(bytes) }  // ACKs
        }
        #expect(head?["Content-Type"] == "image/jpeg" && head?.type == .response && head?.body == [])
        #expect(body == blob)
        #expect(largestPart <= 16 * 1024 && source.largestRead <= 16 * 1024, "read and received a frame at a time")
        #expect(rounds > 10, "the sender waited for acknowledgements")
    }

    @Test func anErrorReplyToAStreamedRequestComesWholeAndAnUnstreamedLargeReplyIsStillRefused() throws {
        var client = BLIPConnection(maxMessageSize: 100_000)
        var server = BLIPConnection()
        try client.send(.request("getAttachment"), streamingReply: true)
        try client.send(.request("getAttachment"))
        var requests: [BLIPMessage] = []
        while let bytes = try client.nextOutgoing() { if let m = try server.receive(bytes) { requests.append(m) } }
        #expect(requests.count == 2)
        try server.fail(requests[0], domain: "HTTP", code: 404, message: "no such blob")
        var replies: [BLIPConnection.Received] = []
        while let bytes = try server.nextOutgoing() { if let r = try client.receiveAny(bytes) { replies.append(r) } }
        guard case .message(let error) = replies.first else {
            Issue.record("no whole error reply: \(replies)")
            return
        }
        #expect(error.error?.code == 404 && error.error?.message == "no such blob")
        try server.respond(to: requests[1], body: [UInt8](repeating: 7, count: 200_000))
        #expect(throws: BLIPError.self) {
            while let bytes = try server.nextOutgoing() { _ = try client.receiveAny(bytes) }
        }
    }
}

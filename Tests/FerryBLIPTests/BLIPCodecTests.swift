import FerryCore
import Testing

@testable import FerryBLIP

@Suite struct BLIPFrameCodecTests {
    @Test func aFrameRoundTripsWithItsNumberTypeFlagsAndData() throws {
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        let frame = BLIPFrame(number: 300, type: .request, flags: [.urgent, .noReply], data: Array("hello".utf8))
        let bytes = try encoder.encode(frame)
        // varint 300 = AC 02; flags 0x30; data; 4 checksum bytes.
        #expect(Array(bytes.prefix(3)) == [0xAC, 0x02, 0x30])
        #expect(bytes.count == 3 + 5 + 4)
        #expect(try decoder.decode(bytes) == frame)
    }

    @Test func theChecksumRunsOverEveryFrameOfTheDirection() throws {
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        let first = try encoder.encode(BLIPFrame(number: 1, type: .request, data: [1, 2, 3]))
        let second = try encoder.encode(BLIPFrame(number: 2, type: .request, data: [1, 2, 3]))
        // The same data, a different checksum: it covers the first frame too.
        #expect(first.suffix(4) != second.suffix(4))
        _ = try decoder.decode(first)
        _ = try decoder.decode(second)
        // A frame lost in between, or altered, fails the check.
        let skipping = BLIPFrameDecoder()
        #expect(throws: BLIPError.self) { try skipping.decode(second) }
        var altered = try encoder.encode(BLIPFrame(number: 3, type: .request, data: [9, 9]))
        altered[2] ^= 0xFF
        #expect(throws: BLIPError.self) { try decoder.decode(altered) }
    }

    @Test func compressedFramesShareOneDeflateContextAndDropTheFlushTrailer() throws {
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        let text = Array(String(repeating: "{\"type\":\"patient\",\"ward\":\"a\"}", count: 40).utf8)
        let first = try encoder.encode(BLIPFrame(number: 1, type: .request, flags: [.compressed], data: text))
        let second = try encoder.encode(BLIPFrame(number: 2, type: .request, flags: [.compressed], data: text))
        #expect(first.count < text.count / 4)
        // The second frame refers back to the first through the shared context: smaller still.
        #expect(second.count < first.count)
        #expect(first.dropLast(4).suffix(4) != [0, 0, 0xFF, 0xFF])
        #expect(try decoder.decode(first).data == text)
        #expect(try decoder.decode(second).data == text)
        // Without the first frame the context lacks what the second refers to.
        #expect(throws: BLIPError.self) { try BLIPFrameDecoder().decode(second) }
    }

    @Test func anAckCarriesNoChecksumAndLeavesTheRunningOneAlone() throws {
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        let ack = try encoder.encode(BLIPFrame(number: 7, type: .ackRequest, data: [0x90, 0x03]))
        #expect(ack == [7, 4, 0x90, 0x03])
        #expect(try decoder.decode(ack).type == .ackRequest)
        _ = try decoder.decode(try encoder.encode(BLIPFrame(number: 1, type: .response, data: [1])))
    }

    @Test(arguments: [
        ([UInt8](), "truncated"), ([0x80], "truncated"), ([1, 0x03, 0, 0, 0, 0], "message type"), ([1, 0x80, 0x01], "flags"),
        ([1, 0x00, 1], "checksum"),
    ])
    func malformedFramesAreRefusedWithAReason(bytes: [UInt8], reason: String) {
        #expect {
            try BLIPFrameDecoder().decode(bytes)
        } throws: { error in
            (error as? BLIPError)?.reason.contains(reason) == true
        }
    }

    @Test func aDeflateBombIsRefused() throws {
        let encoder = BLIPFrameEncoder()
        let big = try encoder.encode(BLIPFrame(number: 1, type: .request, flags: [.compressed], data: [UInt8](repeating: 0, count: 200_000)))
        #expect(big.count < 2_000)
        #expect(throws: BLIPError.self) { try BLIPFrameDecoder(maxFrameData: 100_000).decode(big) }
    }
}

@Suite struct BLIPMessageTests {
    @Test func aMessageRoundTripsThroughFramesAndTheAssembler() throws {
        let message = BLIPMessage(
            type: .request, number: 1, flags: [.compressed],
            properties: [("Profile", "getCheckpoint"), ("client", "cp-1")], body: Array(repeating: 0x41, count: 40_000))
        let frames = try message.frames(maxFrameData: 16 * 1024)
        #expect(frames.count == 3)
        #expect(frames.dropLast().allSatisfy { $0.flags.contains(.moreComing) } && !frames.last!.flags.contains(.moreComing))
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        var assembler = BLIPAssembler()
        var received: BLIPMessage?
        for frame in frames {
            let outcome = try assembler.receive(try decoder.decode(try encoder.encode(frame)))
            if let m = outcome.message { received = m }
        }
        #expect(received == message)
        #expect(received?["Profile"] == "getCheckpoint")
    }

    @Test func aMessageWithoutPropertiesStillWritesTheirZeroLength() throws {
        #expect(try BLIPMessage(type: .response, number: 4).encoded() == [0])
        #expect(try BLIPMessage(type: .response, number: 4, body: [7]).encoded() == [0, 7])
        let props = try BLIPMessage(type: .request, number: 1, properties: [("a", "b")]).encoded()
        #expect(props == [4, 0x61, 0, 0x62, 0])
    }

    @Test(arguments: [
        ([UInt8](), "length"), ([5, 0x61, 0], "shorter"), ([2, 0x61, 0x62], "NUL"), ([2, 0x61, 0], "no value"), ([2, 0xFF, 0], "UTF-8"),
    ])
    func malformedMessagesAreRefusedWithAReason(bytes: [UInt8], reason: String) {
        #expect {
            try BLIPMessage(type: .request, number: 1, flags: [], encoded: bytes)
        } throws: { error in
            (error as? BLIPError)?.reason.contains(reason) == true
        }
    }

    @Test func theAssemblerAcknowledgesTheWireBytesOfLongMessagesAndTakesAcks() throws {
        var assembler = BLIPAssembler(ackThreshold: 15_000)
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        // Compressed: the ACKs count what crossed the wire, not what it inflated to.
        var body: [UInt8] = []
        var rng = SeededGenerator(seed: 7)
        for _ in 0..<200_000 { body.append(UInt8.random(in: 0x61...0x64, using: &rng)) }
        let frames = try BLIPMessage(type: .request, number: 1, flags: [.compressed], body: body).frames(maxFrameData: 16 * 1024)
        var acks: [BLIPFrame] = []
        var wire = 0
        for frame in frames {
            let bytes = try encoder.encode(frame)
            wire += bytes.count - 2
            if let ack = try assembler.receive(try decoder.decode(bytes)).ack { acks.append(ack) }
        }
        let counts = acks.map { Varint.read($0.data, at: 0)!.0 }
        #expect(acks.count >= 2 && counts == counts.sorted() && counts.allSatisfy { $0 < UInt64(wire) })
        #expect(acks.allSatisfy { $0.type == .ackRequest && $0.flags == [.urgent, .noReply] })
        let taken = try assembler.receive(BLIPFrame(number: 3, type: .ackResponse, data: [0x90, 0x03]))
        #expect(taken.acknowledged?.type == .response && taken.acknowledged?.number == 3 && taken.acknowledged?.bytes == 400)
    }

    @Test func requestsMustBeginInOrderAndRepliesAreNumberedApart() throws {
        var assembler = BLIPAssembler()
        _ = try assembler.receive(BLIPFrame(number: 2, type: .request, flags: [.moreComing], data: [0]))
        #expect(throws: BLIPError.self) { try assembler.receive(BLIPFrame(number: 1, type: .request, data: [0])) }
        // A reply to this side's request 1 is another message than the peer's request 1 would be.
        let reply = try assembler.receive(BLIPFrame(number: 1, type: .response, data: [0, 9]))
        #expect(reply.message?.body == [9])
        let finished = try assembler.receive(BLIPFrame(number: 2, type: .request, data: [5]))
        #expect(finished.message?.body == [5])
    }

    @Test func aMessagePastTheLimitIsRefused() throws {
        var assembler = BLIPAssembler(maxMessageSize: 1000)
        _ = try assembler.receive(BLIPFrame(number: 1, type: .request, flags: [.moreComing], data: [UInt8](repeating: 0, count: 900)))
        #expect(throws: BLIPError.self) {
            try assembler.receive(BLIPFrame(number: 1, type: .request, data: [UInt8](repeating: 0, count: 200)))
        }
    }
}

@Suite struct BLIPOutboxTests {
    /// Sends every ready frame through one encoder into one decoder and assembler.
    struct Wire {
        let encoder = BLIPFrameEncoder()
        let decoder = BLIPFrameDecoder()
        var assembler = BLIPAssembler()
        var order: [UInt64] = []
        var received: [BLIPMessage] = []
        var acks: [BLIPFrame] = []

        mutating func drain(_ outbox: inout BLIPOutbox) throws {
            while let bytes = try outbox.nextFrame(encode: { f throws(BLIPError) in try encoder.encode(f) }) {
                let frame = try decoder.decode(bytes)
                order.append(frame.number)
                let outcome = try assembler.receive(frame)
                if let m = outcome.message { received.append(m) }
                if let ack = outcome.ack { acks.append(ack) }
            }
        }
    }

    @Test func messagesAreNumberedAndInterleavedFrameByFrame() throws {
        var outbox = BLIPOutbox(maxFrameData: 1000)
        #expect(try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 1, count: 2500))) == 1)
        #expect(try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 2, count: 1500))) == 2)
        var wire = Wire()
        try wire.drain(&outbox)
        #expect(wire.order == [1, 2, 1, 2, 1])
        #expect(wire.received.map(\.number) == [2, 1])
        #expect(wire.received.first { $0.number == 1 }?.body == Array(repeating: 1, count: 2500))
    }

    @Test func anUrgentMessageGoesAheadWithoutStarvingNormalOnesOrBeginningOutOfOrder() throws {
        var outbox = BLIPOutbox(maxFrameData: 100)
        try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 1, count: 450)))
        var wire = Wire()
        // One frame of request 1 goes, then an urgent request arrives behind it.
        let first = try outbox.nextFrame { f throws(BLIPError) in try wire.encoder.encode(f) }!
        _ = try wire.assembler.receive(try wire.decoder.decode(first))
        try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 2, count: 50)))
        try outbox.enqueue(BLIPMessage(type: .request, number: 0, flags: [.urgent], body: Array(repeating: 3, count: 250)))
        try wire.drain(&outbox)
        // Requests begin in order (3 after 2 began), then the urgent one gets the larger share.
        #expect(wire.order.firstIndex(of: 2)! < wire.order.firstIndex(of: 3)!)
        #expect(wire.received.map(\.number).last == 1)
        #expect(wire.received.count == 3)
    }

    @Test func aMessagePastTheWindowWaitsForItsAckAndGoesOnAfterIt() throws {
        var outbox = BLIPOutbox(maxFrameData: 10_000, window: 25_000)
        try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 7, count: 100_000)))
        var wire = Wire()
        wire.assembler = BLIPAssembler(ackThreshold: 20_000)
        try wire.drain(&outbox)
        // Stopped at the window, with the receiver's ACK to send back.
        #expect(wire.received.isEmpty && outbox.pending == 1 && !outbox.hasFrame)
        #expect(wire.order.count == 3)
        while let ack = wire.acks.popLast() {
            outbox.acknowledged(type: .request, number: ack.number, bytes: Varint.read(ack.data, at: 0)!.0)
            try wire.drain(&outbox)
        }
        #expect(wire.received.first?.body == Array(repeating: 7, count: 100_000))
        #expect(outbox.pending == 0)
    }

    @Test func anAckForMoreThanWasSentIsIgnored() throws {
        var outbox = BLIPOutbox(maxFrameData: 10_000, window: 15_000)
        try outbox.enqueue(BLIPMessage(type: .request, number: 0, body: Array(repeating: 7, count: 50_000)))
        var wire = Wire()
        try wire.drain(&outbox)
        #expect(!outbox.hasFrame)
        outbox.acknowledged(type: .request, number: 1, bytes: 1_000_000)
        #expect(!outbox.hasFrame)
        // An ACK of a reply with that number is another message's.
        outbox.acknowledged(type: .response, number: 1, bytes: 20_000)
        #expect(!outbox.hasFrame)
    }
}

import FerryCore
import Foundation
import IntegrationHarness
import Logging
import Synchronization
import Testing
@testable import FerrySync

/// An in-memory endpoint that also reports partial reads, as a socket transport does.
final class TricklingEndpoint: MessageEndpoint {
    let inner: InMemoryEndpoint
    let receiveActivity: ReceiveActivity? = ReceiveActivity()
    init(_ inner: InMemoryEndpoint) { self.inner = inner }
    var transport: EndpointTransport { inner.transport }
    func send(_ message: [UInt8]) async throws(SyncError) { try await inner.send(message) }
    var incoming: AsyncThrowingStream<[UInt8], any Error> { inner.incoming }
    func close(error: SyncError?) async { await inner.close(error: error) }
}

extension HeartbeatTests {
    @Test func bytesOfAnUnfinishedMessageKeepASlowLinkAliveAndTrueSilenceStillEndsIt() async throws {
        let clock = ManualClock()
        let cut = Switch()
        cut.turn(on: true)
        let (ea, eb) = InMemoryEndpoint.pair(faultsB: .init(deliver: { cut.isOn ? [] : [$0] }))
        let trickling = TricklingEndpoint(ea)
        let a = Connection(endpoint: trickling)
        let b = Connection(endpoint: eb, handler: { request in Message(kind: .response, number: request.number) })
        a.start()
        b.start()
        var quiet = Logger(label: "ferry.test")
        quiet.logLevel = .critical
        a.startLiveness(LivenessPlan(settings: Liveness(), clock: clock, logger: quiet, peerID: "b", mesh: nil, localFull: false))
        func watchdogWaits() async throws {
            try await yieldUntil("a's watchdog waits") {
                a.closeReason != nil || clock.pendingDeadlines.contains { $0 > clock.now.offset }
            }
        }
        try await watchdogWaits()
        // Nothing whole arrives from b for 10 s, but bytes of a large message do, every half second.
        for _ in 0..<20 {
            trickling.receiveActivity?.bytesArrived()
            clock.advance(by: .milliseconds(500))
            try await watchdogWaits()
        }
        #expect(a.closeReason == nil)
        // Then nothing at all: declared dead after `deadAfter` (4 s), as before.
        for _ in 0..<9 {
            clock.advance(by: .milliseconds(500))
            try await watchdogWaits()
        }
        #expect(a.closeReason?.code == SyncError.peerSilentCode)
        await b.close()
    }
}

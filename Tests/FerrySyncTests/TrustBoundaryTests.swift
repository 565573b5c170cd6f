import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// A peer that lies: its replies are rewritten before they reach the replicator.
func hostileLink(to store: DocumentStore, rewrite: @escaping @Sendable ([UInt8]) -> [UInt8]) -> Link {
    var link = Link(to: store)
    link.faults = { _ in
        (.init(), .init(deliver: { bytes in
            guard var m = try? Message(decoding: bytes), m.kind == .response else { return [bytes] }
            m.body = rewrite(m.body)
            return [m.encoded()]
        }))
    }
    return link
}

@Suite(.timeLimit(.minutes(10))) struct TrustBoundaryTests {
    @Test func aRevisionWhoseBodyDoesNotMatchItsIDIsRejectedAndTheRestArrive() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try remote.put(docID("honest"), body: ["v": "ok"])
        try remote.put(docID("forged"), body: ["v": "original"])
        let link = hostileLink(to: remote) { replacing("\"original\"", with: "\"tampered\"", in: $0) }
        var config = ReplicatorConfiguration()
        config.direction = .pull
        let r = Replicator(store: local, connector: link.connector, configuration: config, clock: ImmediateClock())
        let events = r.documentEvents()
        await r.run()
        #expect(r.status.error == nil)
        #expect(try local.document(docID("forged")) == nil)
        #expect(try local.document(docID("honest")) != nil)
        #expect(r.summary.rejected == 1)
        let rejected = await events.first { $0.rejection != nil }
        #expect(rejected?.id == "forged")
        #expect(rejected?.rejection?.hasPrefix("digest") == true)
        // The checkpoint moved past it: a second run does not ask again.
        let again = Replicator(store: local, connector: link.connector, configuration: config, clock: ImmediateClock())
        await again.run()
        #expect(again.status.total == 0)
    }

    @Test func thePeerWritePolicyRefusesForbiddenDocumentsAndDeletes() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try remote.put(docID("public/1"), body: [:])
        try remote.put(docID("admin/1"), body: [:])
        let r = await sync(local, remote, direction: .pull) {
            $0.remotePolicy = PeerPolicy(write: AccessRule(idPrefixes: ["public/"]), mayDelete: false)
        }
        #expect(try local.document(docID("public/1")) != nil)
        #expect(try local.document(docID("admin/1")) == nil)
        #expect(r.summary.rejected == 1)
        let rev = try remote.document(docID("public/1"))!.revision
        try remote.delete(docID("public/1"), revision: rev)
        let r2 = await sync(local, remote, direction: .pull) {
            $0.remotePolicy = PeerPolicy(write: AccessRule(idPrefixes: ["public/"]), mayDelete: false)
        }
        #expect(r2.summary.rejected == 1)
        #expect(try local.document(docID("public/1"))?.deleted == false)
    }

    @Test func theResponderAppliesEachPeersWriteAndReadPolicy() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try local.put(docID("orders/1"), body: ["type": "order"])
        try local.put(docID("secrets/1"), body: ["type": "secret"])
        try remote.put(docID("shared/1"), body: [:])
        try remote.put(docID("hidden/1"), body: [:])
        var options = ReplicationResponder.Options()
        options.policies["tablet-7"] = PeerPolicy(
            read: AccessRule(idPatterns: ["shared/*"]), write: AccessRule(types: ["order"]))
        let r = await sync(local, remote, configure: { $0.wiring.nodeID = "tablet-7" }, responder: options)
        #expect(r.status.error == nil)
        #expect(try remote.document(docID("orders/1")) != nil)
        #expect(try remote.document(docID("secrets/1")) == nil)
        #expect(try local.document(docID("shared/1")) != nil)
        #expect(try local.document(docID("hidden/1")) == nil)
        #expect(r.summary.rejected == 1)
    }

    @Test func anOversizedBodyIsRejectedAndNothingIsStored() async throws {
        var small = StoreOptions()
        small.maxBodyBytes = 2048
        let local = try DocumentStore.inMemory(options: small)
        let remote = try DocumentStore.inMemory()
        try remote.put(docID("huge"), body: ["x": .string(String(repeating: "y", count: 5000))])
        try remote.put(docID("fine"), body: ["x": 1])
        let r = await sync(local, remote, direction: .pull)
        #expect(r.summary.rejected == 1)
        #expect(try local.document(docID("huge")) == nil)
        #expect(try local.document(docID("fine")) != nil)
    }

    @Test func storeValidationIsTheLastStage() async throws {
        var options = StoreOptions()
        options.validator = Validator { $0.body["owner"] == nil && !$0.deleted ? "owner required" : nil }
        let local = try DocumentStore.inMemory(options: options)
        let remote = try DocumentStore.inMemory()
        try remote.put(docID("no-owner"), body: [:])
        try remote.put(docID("owned"), body: ["owner": "me"])
        let r = await sync(local, remote, direction: .pull)
        #expect(r.summary.rejected == 1)
        #expect(try local.document(docID("owned")) != nil)
        #expect(try local.document(docID("no-owner")) == nil)
    }

    @Test func anIncompatibleProtocolVersionIsAPermanentError() async throws {
        let store = try DocumentStore.inMemory()
        let responder = ReplicationResponder(store: store)
        let (client, server) = InMemoryEndpoint.pair()
        Task { await responder.serve(server) }
        let connection = Connection(endpoint: client)
        connection.start()
        do {
            _ = try await connection.requestJSON("hello", ["nodeID": "x", "protocol": [99]])
            Issue.record("hello with protocol 99 was accepted")
        } catch {
            #expect(error.code == "incompatible_version")
            #expect(!error.isTransient)
        }
        do {
            _ = try await connection.requestJSON("changes", ["since": 0])
            Issue.record("a request before hello was answered")
        } catch {
            #expect(error.code == "protocol_error")
        }
    }
}

import FerryCore
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOHTTP1
import Testing

@testable import FerryCouch

/// Which WebSocket upgrades of `/{db}/_blipsync` become Couchbase Lite replications, and
/// what a refused one is answered over HTTP.
@Suite struct MobileAdmissionTests {
    func head(
        _ uri: String = "/ferry/_blipsync", host: String = "127.0.0.1:5984", protocols: String? = "BLIP_3+CBMobile_3,BLIP_3+CBMobile_2",
        authorization: String? = ServerFrontDoorTests.basic("writer", "w-pass"), extra: [(String, String)] = []
    ) -> HTTPRequestHead {
        var headers = HTTPHeaders([("Host", host), ("Upgrade", "websocket"), ("Connection", "Upgrade")])
        if let protocols { headers.add(name: "Sec-WebSocket-Protocol", value: protocols) }
        if let authorization { headers.add(name: "Authorization", value: authorization) }
        headers.add(contentsOf: extra)
        return HTTPRequestHead(version: .http1_1, method: .GET, uri: uri, headers: headers)
    }

    @Test func aUserOfferingCouchbaseLitesProtocolsGetsTheNewestAndItsPolicy() async throws {
        let door = try ServerFrontDoorTests.frontDoor()
        let admitted = try #require(await door.admitMobile(head(), remoteAddress: "127.0.0.1"))
        #expect(admitted.subprotocol == "BLIP_3+CBMobile_3")
        #expect(admitted.principal.name == "writer")
        let older = try #require(await door.admitMobile(head(protocols: "BLIP_3+CBMobile_2"), remoteAddress: "127.0.0.1"))
        #expect(older.subprotocol == "BLIP_3+CBMobile_2")
        let reader = try #require(
            await door.admitMobile(head(authorization: ServerFrontDoorTests.basic("reader", "r-pass")), remoteAddress: "127.0.0.1"))
        #expect(reader.principal.policy.write == .none)
    }

    @Test func upgradesWithoutCredentialsProtocolOrRightAddressAreRefused() async throws {
        let door = try ServerFrontDoorTests.frontDoor()
        let refused: [(String, HTTPRequestHead)] = [
            ("no credentials", head(authorization: nil)),
            ("a wrong password", head(authorization: ServerFrontDoorTests.basic("writer", "nope"))),
            ("no Couchbase Lite subprotocol", head(protocols: nil)),
            ("an unknown subprotocol", head(protocols: "BLIP_3+CBMobile_1")),
            ("a web page's origin", head(extra: [("Origin", "http://127.0.0.1:8080")])),
            ("another database", head("/other/_blipsync")),
            ("a document path", head("/ferry/doc")),
            ("a non-loopback Host on the loopback listener", head(host: "evil.example:5984")),
        ]
        for (what, h) in refused {
            #expect(await door.admitMobile(h, remoteAddress: "127.0.0.1") == nil, "\(what)")
        }
        // The LAN listener has no Host rule.
        let lan = try ServerFrontDoorTests.frontDoor(.lan)
        #expect(await lan.admitMobile(head(host: "clinic-a.local:6984"), remoteAddress: "10.0.0.7") != nil)
    }

    @Test func aRefusedUpgradeIsAnsweredWhy() async throws {
        let app = Application(responder: try ServerFrontDoorTests.frontDoor())
        try await app.test(.router) { client in
            let auth = ServerFrontDoorTests.basic("writer", "w-pass")
            try await client.execute(uri: "/ferry/_blipsync", method: .get, headers: [.authorization: auth]) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("BLIP_3+CBMobile_3"))
            }
            try await client.execute(uri: "/ferry/_blipsync", method: .get) { #expect($0.status == .unauthorized) }
        }
    }
}

// swift-tools-version:6.1
import PackageDescription

// Layers (see docs/architecture.md): dependencies point down only.
//   ferry (CLI) -> FerryNode -> FerryTransport -> FerrySync -> FerryStore -> FerryQuery -> FerryCore
//                         \-> FerryDiscovery (DNS-SD; knows nothing of documents) -> FerryCore
let package = Package(
    name: "Ferry",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ferry", targets: ["ferry"]),
        .executable(name: "ferry-bench", targets: ["ferry-bench"]),
        .executable(name: "ferry-fuzz", targets: ["ferry-fuzz"]),
        // What an app imports to embed Ferry (README, "Replication as a library").
        .library(name: "Ferry", targets: ["Ferry"]),
        .library(name: "FerryCore", targets: ["FerryCore"]),
        .library(name: "FerryStore", targets: ["FerryStore"]),
        .library(name: "FerrySync", targets: ["FerrySync"]),
        .library(name: "FerryTransport", targets: ["FerryTransport"]),
        .library(name: "FerryDiscovery", targets: ["FerryDiscovery"]),
        .library(name: "FerryQuery", targets: ["FerryQuery"]),
        .library(name: "FerryCouch", targets: ["FerryCouch"]),
        .library(name: "FerryCouchClient", targets: ["FerryCouchClient"]),
        .library(name: "FerryNode", targets: ["FerryNode"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift", exact: "7.10.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
    ],
    targets: [
        .target(
            name: "FerryCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")]
        ),
        // CouchDB's collation and Mango selectors: pure, so the store (indexes) and the
        // CouchDB API (changes filters, _find) share one definition.
        .target(name: "FerryQuery", dependencies: ["FerryCore"]),
        .target(
            name: "FerryStore",
            dependencies: [
                "FerryCore", "FerryQuery",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "FerrySync",
            dependencies: [
                "FerryCore", "FerryQuery", "FerryStore",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The one pinned-TLS implementation: the WebSocket transport and the CouchDB client use it.
        .target(
            name: "FerryPinning",
            dependencies: [
                "FerryCore",
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .target(
            name: "FerryTransport",
            dependencies: [
                "FerryCore", "FerryPinning", "FerrySync",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // Avahi's dns_sd compat library (see Sources/CDNSSD/module.modulemap).
        .systemLibrary(name: "CDNSSD", providers: [.apt(["libavahi-compat-libdnssd-dev"])]),
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),
        // Couchbase Lite's message protocol (BLIP 3) as sans-IO frame and message codecs.
        .target(name: "FerryBLIP", dependencies: ["FerryCore", "CZlib"]),
        .target(
            name: "FerryDiscovery",
            dependencies: [
                "FerryCore", "CDNSSD",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The CouchDB HTTP API of a node (Hummingbird): an edge, like the admin API.
        // CouchDB's document and attachment forms and its error shape: what the CouchDB API
        // and the CouchDB-protocol client both speak (no HTTP server, no HTTP client).
        .target(
            name: "FerryCouchDocuments",
            dependencies: [
                "FerryCore", "FerryStore", "CZlib",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The CouchDB replication protocol as a client (AsyncHTTPClient, pinned HTTPS): a
        // second implementation of FerrySync's RemoteDatabase. It does not link the server.
        .target(
            name: "FerryCouchClient",
            dependencies: [
                "FerryCore", "FerryPinning", "FerryStore", "FerrySync", "FerryCouchDocuments",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ]
        ),
        .target(
            name: "FerryCouch",
            dependencies: [
                "FerryCore", "FerryQuery", "FerryStore", "FerrySync", "FerryCouchDocuments", "FerryBLIP", "CZlib",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                // The opt-in LAN listener (HTTPS with the node's certificate) and user password hashes.
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                // Couchbase Lite's replication: `/{db}/_blipsync` upgraded to WebSocket.
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
            ]
        ),
        .target(
            name: "FerryNode",
            dependencies: [
                "FerryCore", "FerryQuery", "FerryStore", "FerrySync", "FerryTransport", "FerryDiscovery", "FerryCouch", "FerryCouchClient",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The embedding front door: a store, a target (.peer, .couchDB, .endpoint), settings.
        .target(
            name: "Ferry",
            dependencies: [
                "FerryCore", "FerryStore", "FerrySync", "FerryTransport", "FerryCouchClient",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .executableTarget(
            name: "ferry",
            dependencies: [
                "FerryCore", "FerryQuery", "FerryStore", "FerrySync", "FerryTransport", "FerryDiscovery", "FerryNode", "FerryCouch", "FerryCouchClient",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // Drives each decoder of bytes from another machine: with libFuzzer (`make fuzz`, built
        // with -sanitize=fuzzer -DFUZZING), or replaying the committed corpora (Fuzz/README.md).
        .executableTarget(
            name: "ferry-fuzz",
            dependencies: [
                "FerryCore", "FerryQuery", "FerrySync", "FerryTransport", "FerryCouch", "FerryCouchDocuments", "FerryCouchClient", "FerryNode",
                "FerryBLIP",
            ]
        ),
        .executableTarget(
            name: "ferry-bench",
            dependencies: [
                "FerryCore", "FerryQuery", "FerryStore", "FerrySync", "FerryTransport", "FerryCouch", "FerryCouchClient", "IntegrationHarness",
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "FerryCoreTests", dependencies: ["FerryCore"]),
        .testTarget(name: "FerryBLIPTests", dependencies: ["FerryBLIP", "FerryCore"]),
        .testTarget(name: "FerryTests", dependencies: ["Ferry"]),
        .testTarget(name: "FerryQueryTests", dependencies: ["FerryQuery", "FerryCore"]),
        .testTarget(
            name: "FerryCouchTests",
            dependencies: [
                "FerryCouch", "FerryCouchDocuments", "FerryCouchClient", "FerryQuery", "FerryStore", "FerrySync", "FerryCore",
                "IntegrationHarness",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "FerryStoreTests", dependencies: ["FerryStore", "FerryQuery", "FerryCore", "IntegrationHarness"]),
        .testTarget(
            name: "FerrySyncTests",
            dependencies: [
                "FerrySync", "FerryStore", "FerryCore", "IntegrationHarness", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                // A second SQLite connection, holding a node's database busy (ResponderOffPoolTests).
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),
        .testTarget(
            name: "FerryPinningTests",
            dependencies: [
                "FerryPinning", "FerryTransport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"), .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "FerryDiscoveryTests", dependencies: ["FerryDiscovery", "IntegrationHarness"]),
        .testTarget(
            name: "FerryNodeTests",
            dependencies: [
                "FerryNode", "FerryTransport", "FerrySync", "FerryStore", "FerryCore", "FerryDiscovery", "FerryCouchClient", "IntegrationHarness",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
            ]
        ),
        .testTarget(
            name: "FerryTransportTests",
            dependencies: [
                "FerryTransport", "FerrySync", "FerryStore", "FerryCore", "IntegrationHarness",
                .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "NIOWebSocket", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "FerryCLITests", dependencies: ["ferry", "FerryCore", "FerryStore", "IntegrationHarness"]),
        // Integration/: the multi-process harness (real `ferry serve` nodes, the LAN lab)
        // and the scenarios run against it (`make integration`).
        .target(
            name: "IntegrationHarness", dependencies: ["FerryCore", .product(name: "Logging", package: "swift-log")],
            path: "Integration/Harness"),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "IntegrationHarness", "Ferry", "FerryCore", "FerryStore", "FerrySync", "FerryTransport", "FerryNode", "ferry",
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOWebSocket", package: "swift-nio"),
            ],
            path: "Integration/Scenarios"),
    ],
    swiftLanguageModes: [.v6]
)

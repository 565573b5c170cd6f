// swift-tools-version:6.1
import PackageDescription

// Layers (see docs/architecture.md): dependencies point down only.
//   ferry (CLI) -> FerrySync -> FerryStore -> FerryCore
let package = Package(
    name: "Ferry",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ferry", targets: ["ferry"]),
        .executable(name: "ferry-bench", targets: ["ferry-bench"]),
        .library(name: "FerryCore", targets: ["FerryCore"]),
        .library(name: "FerryStore", targets: ["FerryStore"]),
        .library(name: "FerrySync", targets: ["FerrySync"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift", exact: "7.10.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .target(
            name: "FerryCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")]
        ),
        .target(
            name: "FerryStore",
            dependencies: [
                "FerryCore",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "FerrySync",
            dependencies: [
                "FerryCore", "FerryStore",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .executableTarget(
            name: "ferry",
            dependencies: [
                "FerryCore", "FerryStore", "FerrySync",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "ferry-bench",
            dependencies: [
                "FerryCore", "FerryStore", "FerrySync",
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .testTarget(name: "FerryCoreTests", dependencies: ["FerryCore"]),
        .testTarget(name: "FerryStoreTests", dependencies: ["FerryStore", "FerryCore"]),
        .testTarget(
            name: "FerrySyncTests",
            dependencies: [
                "FerrySync", "FerryStore", "FerryCore", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(name: "FerryCLITests", dependencies: ["ferry", "FerryCore", "FerryStore"]),
    ],
    swiftLanguageModes: [.v6]
)

// swift-tools-version:6.1
import PackageDescription

// Imports point one way:
//   CLibPQ ← PostgresKit ← AdTallyStorage ← AdTallyHTTP ← AdTallyApp ← adtally
//   AdTallyCore (no I/O) is used by Storage, HTTP and App.
//   TextFormats (UUID and timestamp text) sits under both PostgresKit and AdTallyCore.
let strict: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "adtally",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "adtally", targets: ["adtally"]),
        // For the libFuzzer harnesses in Fuzz/ (make fuzz).
        .library(name: "AdTallyCore", targets: ["AdTallyCore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // The networks' report pulls; tests and the benchmark driver: a real HTTP client.
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        // The app-side kit (a package of its own, no dependencies): the tests drive it against a real server.
        .package(path: "Clients/AdTallyKit"),
    ],
    targets: [
        // libpq, the PostgreSQL C client, from the system (Debian: libpq-dev).
        .systemLibrary(
            name: "CLibPQ",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        // zlib, for gzip-compressed request bodies (Debian: zlib1g-dev).
        .systemLibrary(
            name: "CZlib",
            pkgConfig: "zlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        // UUID and timestamp text on hot paths, shared by the core and the PostgreSQL layer.
        .target(name: "TextFormats", swiftSettings: strict),
        // The only way AdTally talks to PostgreSQL: bound queries, typed rows, COPY, a pool.
        .target(
            name: "PostgresKit",
            dependencies: [
                "CLibPQ", "TextFormats",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // Domain core: events, validation, metrics, money, time. No I/O.
        .target(name: "AdTallyCore", dependencies: ["TextFormats"], swiftSettings: strict),
        // Storage: migrations, the embedded cluster, repositories. Knows nothing of HTTP.
        .target(
            name: "AdTallyStorage",
            dependencies: [
                "AdTallyCore", "PostgresKit", "TextFormats",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // The thin HTTP layer on Hummingbird 2.
        .target(
            name: "AdTallyHTTP",
            dependencies: [
                "AdTallyCore", "AdTallyStorage", "CZlib", "PostgresKit",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            // The API's document, compiled into the binary (no bundle to ship beside it).
            resources: [.embedInCode("Resources/openapi.yaml")],
            swiftSettings: strict
        ),
        // The composition root: configuration, wiring, services.
        .target(
            name: "AdTallyApp",
            dependencies: [
                "AdTallyCore", "AdTallyStorage", "AdTallyHTTP", "PostgresKit", "TextFormats",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                // The networks' reporting APIs (pulls, DESIGN §11).
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "adtally",
            dependencies: [
                "AdTallyApp", "AdTallyCore", "AdTallyStorage", "PostgresKit",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Throwaway databases for tests, inside the cluster `make test` starts.
        .target(
            name: "AdTallyTestSupport",
            dependencies: ["PostgresKit"],
            path: "Tests/Support",
            exclude: ["fake_postgres.py"],
            swiftSettings: strict
        ),
        // make bench-*: generates realistic events and drives a running server over HTTP.
        .executableTarget(
            name: "adtally-bench",
            dependencies: [
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PostgresKitTests",
            dependencies: ["PostgresKit", "AdTallyCore", "AdTallyStorage", "AdTallyTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "AdTallyTests",
            dependencies: [
                "AdTallyApp", "AdTallyCore", "AdTallyStorage", "AdTallyHTTP", "PostgresKit", "AdTallyTestSupport", "TextFormats",
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "AdTallyKit", package: "AdTallyKit"),
            ],
            // The networks' report files the importers are tested on, read by path.
            exclude: ["Fixtures"],
            swiftSettings: strict
        ),
    ]
)

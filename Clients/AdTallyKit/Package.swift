// swift-tools-version:5.9
import PackageDescription

// AdTallyKit: the app side of AdTally (DESIGN §10). No third-party dependencies:
// Foundation (FoundationNetworking on Linux) and the system's zlib, which every
// Apple SDK and Linux distribution ship, for gzip and CRC-32; on Linux, the system's
// libcurl (which FoundationNetworking is built on) for requests whose answers the kit
// must be able to cut off at a cap (Transport+Curl.swift says why).
let package = Package(
    name: "AdTallyKit",
    platforms: [.iOS(.v13), .macOS(.v10_15), .tvOS(.v13)],
    products: [
        .library(name: "AdTallyKit", targets: ["AdTallyKit"]),
        .executable(name: "adtally-kit-example", targets: ["adtally-kit-example"]),
    ],
    targets: [
        // zlib from the system (Debian: zlib1g-dev; Apple platforms: the SDK's libz).
        .systemLibrary(name: "AdTallyKitZlib", path: "Sources/AdTallyKitZlib"),
        // libcurl on Linux only (Debian: libcurl4-openssl-dev); Apple platforms use URLSession.
        .systemLibrary(name: "AdTallyKitCurl", path: "Sources/AdTallyKitCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // PrivacyInfo.xcprivacy: the required-reason APIs the kit calls, shipped inside the
        // target's folder so that it reaches the app (scripts/privacy_manifest_check.py checks it).
        .target(
            name: "AdTallyKit",
            dependencies: ["AdTallyKitZlib", .target(name: "AdTallyKitCurl", condition: .when(platforms: [.linux]))],
            resources: [.copy("PrivacyInfo.xcprivacy")]
        ),
        // Command-line helpers the three executables below share (not a product).
        .target(name: "KitCommandLine"),
        // Sends a banner and an interstitial's life to a server: the first thing to try after `adtally demo`.
        .executableTarget(name: "adtally-kit-example", dependencies: ["AdTallyKit", "KitCommandLine"]),
        // The kill test's child: records slots' real sequences until it is killed (Tests/AdTallyTests/KitTests).
        .executableTarget(name: "adtally-kit-child", dependencies: ["AdTallyKit", "KitCommandLine"]),
        // make bench-client: record latency, sustained rate and RSS against a local server.
        .executableTarget(name: "adtally-kit-bench", dependencies: ["AdTallyKit", "KitCommandLine"]),
        .testTarget(name: "AdTallyKitTests", dependencies: ["AdTallyKit"]),
    ]
)

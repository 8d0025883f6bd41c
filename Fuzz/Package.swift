// swift-tools-version:6.1
import PackageDescription

// libFuzzer harnesses, a package of their own: built only by `make fuzz`, with
// -sanitize=fuzzer,address (libFuzzer supplies main, so they cannot live among the
// main package's executables, which `swift build` links normally).
let package = Package(
    name: "adtally-fuzz",
    dependencies: [.package(name: "adtally", path: ".."), .package(name: "AdTallyKit", path: "../Clients/AdTallyKit")],
    targets: [
        // libFuzzer's driver, which each harness's main calls.
        .target(name: "FuzzDriver"),
        // The ingest body readers (JSON and NDJSON, with the event limit) and the validator.
        .executableTarget(name: "FuzzIngestBody", dependencies: ["FuzzDriver", .product(name: "AdTallyCore", package: "adtally")]),
        // The CSV reader of `adtally ingest` and the validator in its text-values mode.
        .executableTarget(name: "FuzzCSV", dependencies: ["FuzzDriver", .product(name: "AdTallyCore", package: "adtally")]),
        // The FX and rate-card CSV readers (chunked against whole, BOMs in the corpus) and the CSV cell writer.
        .executableTarget(name: "FuzzMoneyCSV", dependencies: ["FuzzDriver", .product(name: "AdTallyCore", package: "adtally")]),
        // The readers of the networks' own reports (AdMob, MAX, LevelPlay, generic CSV), every input as each.
        .executableTarget(name: "FuzzNetworkReport", dependencies: ["FuzzDriver", .product(name: "AdTallyCore", package: "adtally")]),
        // AdTallyKit's readers of the network's answers: the batch receipt and the switch answer.
        .executableTarget(name: "FuzzKitAnswers", dependencies: ["FuzzDriver", .product(name: "AdTallyKit", package: "AdTallyKit")]),
    ]
)

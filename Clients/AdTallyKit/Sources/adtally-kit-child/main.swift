import AdTallyKit
import KitCommandLine
import Foundation
#if canImport(Glibc)
import Glibc
#endif

// The kill test's child (Tests/AdTallyTests/KitTests.swift): records ad slots' real
// sequences (DESIGN §1) into the queue folder until it is killed, printing
// `begin TYPE` before each call and `did ID TYPE` once the call returned, so that the
// test knows every event it was told was recorded, and the few in flight at the kill.
//
//   adtally-kit-child --server URL --key KEY --dir DIR --seed N [--flush]
//
// --flush: record nothing, wait until the queue is empty, print `flushed`, exit.

guard let server = option("--server").flatMap(URL.init(string:)), let key = option("--key"), let dir = option("--dir") else {
    say("usage: adtally-kit-child --server URL --key KEY --dir DIR --seed N [--flush]")
    exit(2)
}
var configuration = AdTallyConfiguration()
configuration.sendAfterEvents = 50
configuration.sendInterval = 0.2
configuration.retryBase = 0.1
configuration.retryCap = 1
configuration.country = "JP"
configuration.appVersion = "1.0"
let tally = try AdTally(server: server, appKey: key, directory: URL(fileURLWithPath: dir), configuration: configuration)

if CommandLine.arguments.contains("--flush") {
    waitFor {
        try await tally.flush()
        say("flushed")
    }
    exit(0)
}

var seed = UInt64(option("--seed") ?? "1") ?? 1
func next(_ bound: Int) -> Int {
    // SplitMix64: a sequence the seed repeats.
    seed &+= 0x9E37_79B9_7F4A_7C15
    var z = seed
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return Int((z ^ (z >> 31)) % UInt64(bound))
}

func call(_ type: String, _ body: () throws -> UUID) {
    say("begin \(type)")
    do {
        let id = try body()
        say("did \(id.uuidString.lowercased()) \(type)")
    } catch {
        say("error \(error)")
        exit(3)
    }
}

call("session") { try tally.sessionStarted() }
let networks = ["admob", "iad", "nend"]
while true {
    let network = networks[next(networks.count)]
    if next(2) == 0 {
        let slot = try tally.slot(network: network, format: .banner, placement: "home", size: "320x50")
        call("request") { try slot.requested() }
        if next(4) == 0 {
            call("error") { try slot.failed(code: 3) }
        } else {
            call("impression") { try slot.shown() }
            if next(5) == 0 {
                call("tap") { try slot.tapped(willLeave: next(2) == 0) }
                if next(3) == 0 { call("action_cancel") { try slot.actionCancelled() } }
            }
        }
    } else {
        let slot = try tally.slot(network: network, format: .interstitial, placement: "level_end")
        call("request") { try slot.requested() }
        if next(5) == 0 {
            call("error") { try slot.failed(code: 2) }
        } else {
            call("load") { try slot.loaded() }
            if next(3) != 0 {
                call("impression") { try slot.shown(revenueMicros: 2_000, currency: "USD", precision: .precise) }
                if next(4) == 0 { call("tap") { try slot.tapped(willLeave: true) } }
            }
            call("expiry") { try slot.expired() }
        }
    }
    usleep(UInt32(200 + next(800)))
}

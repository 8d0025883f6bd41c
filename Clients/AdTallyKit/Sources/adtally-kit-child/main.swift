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
// --opt-out / --opt-in: call optOut() / optIn() first (the consent tests).
//
// The hostile-network tests (Tests/AdTallyTests/KitHostileNetworkTests.swift) drive it
// as a small app that must end normally whatever it is answered:
//
//   adtally-kit-child ... --record N [--until-full] [--wait S] [--switch PLACEMENT]
//                         [--timeout S] [--segment-bytes B] [--max-queue-bytes B]
//
// records N events (printing `did ID TYPE` for each), or until a call fails with
// --until-full (printing `full N MICROSECONDS`: the failed call's cost); then for S
// seconds lets the kit send (and with --switch reads the switch every 10 ms, printing
// `network NAME` for each answer it has not printed yet, and `refreshed NAME` after a
// refreshNetwork); prints every notice (`notice …`), then `status …` and
// `rss_peak_kib N` (VmHWM), and exits 0.

guard let server = option("--server").flatMap(URL.init(string:)), let key = option("--key"), let dir = option("--dir") else {
    say("usage: adtally-kit-child --server URL --key KEY --dir DIR --seed N [--flush] | --record N [--wait S] [--switch P] ...")
    exit(2)
}
var configuration = AdTallyConfiguration()
configuration.sendAfterEvents = 50
configuration.sendInterval = 0.2
configuration.retryBase = 0.1
configuration.retryCap = 1
configuration.country = "JP"
configuration.appVersion = "1.0"
if let seconds = option("--timeout").flatMap(Double.init) { configuration.requestTimeout = seconds }
if let bytes = option("--segment-bytes").flatMap(Int.init) { configuration.segmentBytes = bytes }
if let bytes = option("--max-queue-bytes").flatMap(Int.init) { configuration.maxQueueBytes = bytes }
configuration.notices = { notice in say("notice \(notice)") }
let tally = try AdTally(server: server, appKey: key, directory: URL(fileURLWithPath: dir), configuration: configuration)
// Consent (Tests/AdTallyTests/KitPrivacyTests.swift): before anything is recorded.
if CommandLine.arguments.contains("--opt-out") { try tally.optOut(); say("opted-out") }
if CommandLine.arguments.contains("--opt-in") { try tally.optIn(); say("opted-in") }

if CommandLine.arguments.contains("--flush") {
    waitFor {
        try await tally.flush()
        say("flushed")
    }
    exit(0)
}

if let count = option("--record").flatMap(Int.init) {
    let untilFull = CommandLine.arguments.contains("--until-full")
    var recorded = 0
    func once(_ type: String, _ body: () throws -> UUID) -> Bool {
        let start = DispatchTime.now().uptimeNanoseconds
        do {
            let id = try body()
            say("did \(id.uuidString.lowercased()) \(type)")
            recorded += 1
            return true
        } catch {
            let micros = (DispatchTime.now().uptimeNanoseconds - start) / 1000
            if untilFull {
                say("full \(recorded) \(micros) \(error)")
                return false
            }
            say("error \(error)")
            exit(3)
        }
    }
    _ = once("session") { try tally.sessionStarted() }
    var index = 0
    while untilFull || recorded < count {
        let slot = try tally.slot(network: ["admob", "iad", "nend"][index % 3], format: .banner, placement: "home", size: "320x50")
        index += 1
        guard once("request", { try slot.requested() }) else { break }
        if !untilFull && recorded >= count { break }
        guard once("impression", { try slot.shown() }) else { break }
    }
    let seconds = option("--wait").flatMap(Double.init) ?? 3
    let placement = option("--switch")
    let done = DispatchSemaphore(value: 0)
    Task.detached {
        var seen: Set<String> = []
        if let placement {
            say("refreshed \(await tally.refreshNetwork(for: placement) ?? "nil")")
        }
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            if let placement {
                let name = tally.network(for: placement) ?? "nil"
                if seen.insert(name).inserted { say("network \(name)") }
            }
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        if let placement {
            say("refreshed \(await tally.refreshNetwork(for: placement) ?? "nil")")
        }
        done.signal()
    }
    done.wait()
    let status = tally.status
    let dropped = status.dropped.map { "\($0.key.rawValue):\($0.value)" }.sorted().joined(separator: ",")
    say("status pending=\(status.pending) pending_bytes=\(status.pendingBytes) delivered=\(status.delivered) dead=\(status.deadLettered) unexpected=\(status.unexpectedAnswers) requests=\(status.requests) switch_fetches=\(status.switchFetches) dropped=\(dropped) opted_out=\(status.isOptedOut) forgets=\(status.forgetsPending) erased=\(status.erased)")
    let vm = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    let peak = vm.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }?.split(separator: " ").dropFirst().first ?? "-1"
    say("rss_peak_kib \(peak)")
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

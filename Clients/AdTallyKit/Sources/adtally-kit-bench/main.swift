import AdTallyKit
import KitCommandLine
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// make bench-client (bench/client.sh): the kit's cost in the app's process.
//
//   adtally-kit-bench --server URL --key KEY --dir DIR [--events N] [--sustained N]
//
// 1. floor: write(2) of a same-sized record to a file, N times (the least persisting can cost);
// 2. record latency: N `shown()`/`requested()` calls, each timed, while the sender
//    sends to the server (persistence included: each call has written its record);
// 3. the same with Durability.syncEveryRecord (an fsync per record), N/20 calls;
// 4. sustained: SUSTAINED events recorded as fast as one thread can, then flush();
//    events/s from the first record to the server's last answer;
// 5. stalled: a server of the bench's own that answers a batch's head and then nothing;
//    N `requested()`/`failed()` calls timed while the sender waits on it, with small segments and
//    bound so that segments rotate and the bound drops whole ones meanwhile;
// 6. peak RSS of this process (VmHWM); the RESULT line.

guard let server = option("--server").flatMap(URL.init(string:)), let key = option("--key"), let dir = option("--dir") else {
    print("usage: adtally-kit-bench --server URL --key KEY --dir DIR [--events N] [--sustained N]")
    exit(2)
}
let events = Int(option("--events") ?? "") ?? 100_000
let sustained = Int(option("--sustained") ?? "") ?? 200_000

func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

func percentiles(_ samples: [UInt32]) -> (p50: Double, p99: Double) {
    let sorted = samples.sorted()
    return (Double(sorted[sorted.count / 2]) / 1000, Double(sorted[min(sorted.count - 1, sorted.count * 99 / 100)]) / 1000)
}

func peakRSSMiB() -> Double {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
          let kib = Double(line.split(separator: " ").dropFirst().first ?? "") else { return -1 }
    return kib / 1024
}

func rssMiB() -> Double {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kib = Double(line.split(separator: " ").dropFirst().first ?? "") else { return -1 }
    return kib / 1024
}

func checkpoint(_ label: String) {
    if ProcessInfo.processInfo.environment["BENCH_RSS_TRACE"] == "1" {
        print(String(format: "  rss %-28@ now %6.1f MiB, peak %6.1f MiB", label, rssMiB(), peakRSSMiB()))
    }
}

checkpoint("start")
// The process's floor before the kit: Foundation and one URLSession request (on Linux,
// libcurl's), measured in this run so that the kit's own part can be told apart.
waitFor {
    var probe = URLRequest(url: server.appendingPathComponent("healthz"))
    probe.httpMethod = "GET"
    _ = try await URLSession.shared.data(for: probe)
}
let floorRSS = rssMiB()
checkpoint("floor: Foundation + a request")
let base = URL(fileURLWithPath: dir)
try? FileManager.default.removeItem(at: base)
try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)

// 1. The floor: an append of a record of the same size (~330 bytes) with write(2).
let record = [UInt8](repeating: 0x61, count: 340)
let fd = open(base.appendingPathComponent("floor").path, O_WRONLY | O_CREAT | O_APPEND, 0o600)
// Samples as 32-bit nanoseconds: the bench's own arrays stay small in the RSS it reports.
var floor: [UInt32] = []
floor.reserveCapacity(events)
for _ in 0..<events {
    let start = now()
    _ = record.withUnsafeBytes { write(fd, $0.baseAddress!, $0.count) }
    floor.append(UInt32(clamping: now() - start))
}
close(fd)
let floorP = percentiles(floor)
checkpoint("after the floor")
print(String(format: "floor: write(2) of a 340-byte record    p50 %7.2f µs  p99 %7.2f µs", floorP.p50, floorP.p99))

var configuration = AdTallyConfiguration()
configuration.country = "JP"
configuration.appVersion = "1.0"
configuration.maxQueueBytes = 256 << 20

// 2. record latency while sending.
var latencies: [UInt32] = []
latencies.reserveCapacity(events)
do {
    let tally = try AdTally(server: server, appKey: key, directory: base.appendingPathComponent("latency"), configuration: configuration)
    var slot = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50")
    for index in 0..<events {
        let start = now()
        if index % 2 == 0 {
            if index % 1000 == 0 { slot = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50") }
            try slot.requested()
        } else {
            try slot.shown(revenueMicros: 1200, currency: "USD", precision: .precise)
        }
        latencies.append(UInt32(clamping: now() - start))
    }
    waitFor { try await tally.flush() }
}
checkpoint("after the latency run")
let recordP = percentiles(latencies)
print(String(format: "record (syncEvery 1 s, the default)     p50 %7.2f µs  p99 %7.2f µs  (%d calls, sending meanwhile)", recordP.p50, recordP.p99, events))

// 3. An fsync per record.
var synced: [UInt32] = []
do {
    var strict = configuration
    strict.durability = .syncEveryRecord
    let tally = try AdTally(server: server, appKey: key, directory: base.appendingPathComponent("synced"), configuration: strict)
    let count = max(100, events / 20)
    for _ in 0..<count {
        let start = now()
        try tally.sessionStarted()
        synced.append(UInt32(clamping: now() - start))
    }
    waitFor { try await tally.flush() }
}
checkpoint("after the fsync run")
let syncedP = percentiles(synced)
print(String(format: "record (syncEveryRecord: fsync each)    p50 %7.2f µs  p99 %7.2f µs  (%d calls)", syncedP.p50, syncedP.p99, synced.count))

// 4. Sustained: recorded as fast as one thread can, until the server answered them all.
var rate = 0.0
do {
    let tally = try AdTally(server: server, appKey: key, directory: base.appendingPathComponent("sustained"), configuration: configuration)
    let start = now()
    var slot = try tally.slot(network: "iad", format: .interstitial, placement: "level_end")
    for index in 0..<(sustained / 4) {
        if index % 250 == 0 { slot = try tally.slot(network: "iad", format: .interstitial, placement: "level_end") }
        try slot.requested()
        try slot.loaded()
        try slot.shown(revenueMicros: 9000, currency: "USD", precision: .estimated)
        try slot.expired()
    }
    let recorded = now()
    checkpoint("sustained: recorded")
    waitFor { try await tally.flush() }
    checkpoint("sustained: flushed")
    let seconds = Double(now() - start) / 1e9
    rate = Double(sustained / 4 * 4) / seconds
    let status = tally.status
    print(String(format: "sustained: %d events in %.2f s (recording took %.2f s): %.0f events/s delivered; %d requests, %d pending, %d refused",
                 sustained / 4 * 4, seconds, Double(recorded - start) / 1e9, rate, status.requests, status.pending, status.deadLettered))
}
// 5. Stalled: the sender waits on an answer that never comes, while the app records.
/// A server on 127.0.0.1 that reads each request's head, answers a 200's head and then
/// holds the connection open without a byte more (until the bench ends).
func stallingServer() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    listen(fd, 16)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    Thread.detachNewThread {
        var held: [Int32] = []
        while true {
            let client = accept(fd, nil, nil)
            guard client >= 0 else { return }
            var buffer = [UInt8](repeating: 0, count: 65536)
            _ = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress!, $0.count, 0) }
            let head = Array("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n".utf8)
            _ = head.withUnsafeBytes { send(client, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
            held.append(client)
        }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}
var stalled: [UInt32] = []
var stalledDropped = 0
do {
    let port = stallingServer()
    var stalling = configuration
    stalling.segmentBytes = 64 << 10
    stalling.maxQueueBytes = 1 << 20
    stalling.sendAfterEvents = 50
    stalling.requestTimeout = 600
    let tally = try AdTally(server: URL(string: "http://127.0.0.1:\(port)")!, appKey: key, directory: base.appendingPathComponent("stalled"), configuration: stalling)
    // The first batch goes out (50 events) and stalls before the timed calls begin.
    for _ in 0..<100 { try tally.sessionStarted() }
    usleep(300_000)
    let count = events
    stalled.reserveCapacity(count)
    var slot = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50")
    for index in 0..<count {
        if index % 1000 == 0 { slot = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50") }
        let start = now()
        if index % 2 == 0 { try slot.requested() } else { try slot.failed(code: 3) }
        stalled.append(UInt32(clamping: now() - start))
    }
    let status = tally.status
    stalledDropped = status.dropped[.queueFull] ?? 0
    print(String(format: "stalled: %d calls while the sender waited on a stalled answer; queue %d bytes (bound %d), %d events dropped by the bound, counted",
                 count, status.pendingBytes, stalling.maxQueueBytes, stalledDropped))
}
checkpoint("after the stalled run")
let stalledP = percentiles(stalled)
let stalledMax = Double(stalled.max() ?? 0) / 1000
print(String(format: "record (server stalled, segments rotating) p50 %7.2f µs  p99 %7.2f µs  max %8.2f µs", stalledP.p50, stalledP.p99, stalledMax))

let rss = peakRSSMiB()
print(String(format: "peak RSS of this process: %.1f MiB; before the kit (Foundation and one URLSession request): %.1f MiB; the kit's part: %.1f MiB", rss, floorRSS, rss - floorRSS))
print(String(format: "ratios: record p50 / write(2) p50 = %.1f; fsync-per-record p50 / default p50 = %.0f", recordP.p50 / floorP.p50, syncedP.p50 / recordP.p50))
print(String(format: "RESULT record_p50_us=%.2f record_p99_us=%.2f client_events_per_s=%.0f client_rss_mb=%.1f floor_rss_mb=%.1f kit_rss_mb=%.1f write_p50_us=%.2f synced_record_p50_us=%.1f stalled_record_p99_us=%.2f stalled_record_max_us=%.2f",
             recordP.p50, recordP.p99, rate, rss, floorRSS, rss - floorRSS, floorP.p50, syncedP.p50, stalledP.p99, stalledMax))

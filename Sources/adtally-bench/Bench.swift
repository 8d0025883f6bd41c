import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import Synchronization

/// `adtally-bench`: the load side of `make bench-ingest`.
@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "adtally-bench",
        abstract: "Generate realistic ad events and drive POST /v1/events with them.",
        subcommands: [Generate.self, Drive.self, Fetch.self]
    )
}

/// A small deterministic generator (xorshift), so runs are comparable.
struct Random {
    var state: UInt64
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
    mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
    mutating func pick<T>(_ weighted: [(T, Int)]) -> T {
        var roll = below(weighted.reduce(0) { $0 + $1.1 })
        for (value, weight) in weighted {
            if roll < weight { return value }
            roll -= weight
        }
        return weighted[0].0
    }
    mutating func uuid() -> String {
        let high = next(), low = next()
        let hex = String(format: "%016llx%016llx", high, low)
        let chars = Array(hex)
        return "\(String(chars[0..<8]))-\(String(chars[8..<12]))-4\(String(chars[13..<16]))-a\(String(chars[17..<20]))-\(String(chars[20..<32]))"
    }
}

extension Bench {
    struct Generate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write batches (one JSON body per line, with its app) and the same rows as CSV for COPY."
        )
        @Option(help: "Number of apps.") var apps = 20
        @Option(help: "Batches to write.") var batches = 3000
        @Option(help: "Events per batch.") var batchSize = 100
        @Option(help: "Output folder.") var out: String
        @Option(help: "Random seed (the same seed writes the same events).") var seed: UInt64 = 0x9E37_79B9_7F4A_7C15

        func run() throws {
            var random = Random(state: seed | 1)
            let types: [(String, Int)] = [("request", 45), ("impression", 30), ("load", 8), ("tap", 5), ("error", 7), ("expiry", 3), ("action_cancel", 2)]
            let networks: [(String, Int)] = [("admob", 40), ("applovin", 20), ("unity", 12), ("meta", 12), ("iad", 8), ("nend", 8)]
            let countries: [(String, Int)] = [
                ("US", 30), ("JP", 15), ("DE", 8), ("GB", 7), ("IN", 10), ("BR", 6), ("FR", 5), ("KR", 4), ("CA", 4), ("AU", 3),
                ("NP", 2), ("MX", 3), ("ID", 3), ("ZZ", 2),
            ]
            let formats: [(String, Int)] = [("banner", 55), ("interstitial", 25), ("native", 10), ("rewarded", 10)]
            let platforms: [(String, Int)] = [("ios", 45), ("android", 45), ("ipados", 8), ("other", 2)]
            let placements = ["home_banner", "level_end", "feed_native", "settings", "reward_coins", "article_bottom"]
            let currencies: [(String, Int)] = [("USD", 80), ("JPY", 10), ("EUR", 10)]
            let now = Date().timeIntervalSince1970

            _ = FileManager.default.createFile(atPath: out + "/batches.jsonl", contents: nil)
            _ = FileManager.default.createFile(atPath: out + "/rows.csv", contents: nil)
            let batchFile = try FileHandle(forWritingTo: URL(fileURLWithPath: out + "/batches.jsonl"))
            let csvFile = try FileHandle(forWritingTo: URL(fileURLWithPath: out + "/rows.csv"))
            defer { try? batchFile.close(); try? csvFile.close() }
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]

            for _ in 0..<batches {
                let app = "bench-app-\(random.below(apps))"
                var events: [String] = []
                var rows = ""
                for _ in 0..<batchSize {
                    let type = random.pick(types)
                    let id = random.uuid()
                    // As apps send them: most within seconds to minutes of happening, a few
                    // from devices that were offline, up to 6 days late (still in the window).
                    let delayMillis = random.below(100) < 97 ? random.below(300_000) : random.below(6 * 86_400 * 1000)
                    let at = Date(timeIntervalSince1970: now - Double(delayMillis) / 1000)
                    let atText = formatter.string(from: at)
                    let network = random.pick(networks)
                    let format = random.pick(formats)
                    let country = random.pick(countries)
                    let platform = random.pick(platforms)
                    let placement = placements[random.below(placements.count)]
                    let size = format == "banner" ? "320x50" : nil
                    let device = "dev-\(random.below(50_000))"
                    let appVersion = "3.\(random.below(5)).\(random.below(10))"
                    let osVersion = platform == "android" ? "\(12 + random.below(4))" : "17.\(random.below(6))"
                    var revenue: Int?
                    var currency: String?
                    if type == "impression" && random.below(10) < 3 {
                        revenue = 200 + random.below(5000)
                        currency = random.pick(currencies)
                    }
                    let errorCode: Int? = type == "error" ? [1, 2, 3, 204, 500][random.below(5)] : nil
                    let willLeave: Bool? = type == "tap" ? random.below(2) == 0 : nil
                    let shown: Bool? = type == "expiry" ? random.below(3) == 0 : nil

                    var json = #"{"id":"\#(id)","type":"\#(type)","occurred_at":"\#(atText)","network":"\#(network)","format":"\#(format)","#
                        + #""placement":"\#(placement)","country":"\#(country)","platform":"\#(platform)","os_version":"\#(osVersion)","#
                        + #""app_version":"\#(appVersion)","device":"\#(device)""#
                    if let size { json += #","size":"\#(size)""# }
                    if let revenue, let currency { json += #","revenue_micros":\#(revenue),"currency":"\#(currency)""# }
                    if let errorCode { json += #","error_code":\#(errorCode)"# }
                    if let willLeave { json += #","will_leave":\#(willLeave)"# }
                    if let shown { json += #","shown":\#(shown)"# }
                    json += "}"
                    events.append(json)

                    let cells: [String] = [
                        app, atText, id, type, network, format, placement, size ?? "", country, platform, osVersion, appVersion, device,
                        revenue.map(String.init) ?? "", currency ?? "", errorCode.map(String.init) ?? "",
                        willLeave.map { $0 ? "t" : "f" } ?? "", shown.map { $0 ? "t" : "f" } ?? "",
                    ]
                    rows += cells.joined(separator: ",") + "\n"
                }
                batchFile.write(Data("\(app)\t{\"events\":[\(events.joined(separator: ","))]}\n".utf8))
                csvFile.write(Data(rows.utf8))
            }
        }
    }

    struct Drive: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Send every batch once over keep-alive connections; print rate and latency.")
        @Option(help: "Server base URL.") var url = "http://127.0.0.1:8080"
        @Option(help: "File of app<TAB>key lines.") var keys: String
        @Option(help: "batches.jsonl from generate.") var batches: String
        @Option(help: "Concurrent connections.") var connections = 8
        @Option(help: "Server process id, for its peak RSS.") var serverPID: Int32?
        @Option(help: "Batches per second over all connections (0: as fast as the server takes them).") var rate: Double = 0
        @Option(help: "Stop (after the batches in flight) once this file exists.") var stopFile: String?
        @Option(help: "Skip this many batches of the file first (to go on where an earlier drive stopped).") var skip = 0
        @Option(help: "Create this file once the batches are read and sending starts.") var readyFile: String?

        func run() async throws {
            var keyByApp: [String: String] = [:]
            for line in try String(contentsOfFile: keys, encoding: .utf8).split(separator: "\n") {
                let parts = line.split(separator: "\t")
                if parts.count == 2 { keyByApp[String(parts[0])] = String(parts[1]) }
            }
            let bodies: [(key: String, body: ByteBuffer, events: Int)] = try Data(contentsOf: URL(fileURLWithPath: batches))
                .split(separator: UInt8(ascii: "\n")).map { line in
                    let bytes = Array(line)
                    let tab = bytes.firstIndex(of: UInt8(ascii: "\t"))!
                    let body = bytes[(tab + 1)...]
                    // Events in the batch: occurrences of "id": (each event has exactly one).
                    let marker = Array(#""id":"#.utf8)
                    var events = 0
                    var index = body.startIndex
                    while index + marker.count <= body.endIndex {
                        if body[index] == marker[0] && body[index..<index + marker.count].elementsEqual(marker) {
                            events += 1
                            index += marker.count
                        } else {
                            index += 1
                        }
                    }
                    return (keyByApp[String(decoding: bytes[..<tab], as: UTF8.self)]!, ByteBuffer(bytes: body), events)
                }
            var configuration = HTTPClient.Configuration()
            configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: connections)
            let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
            let baseURL = url
            let next = Counter(start: skip)
            let rate = self.rate, stopFile = self.stopFile
            let cpuBefore = Self.cpuSeconds()
            let started = ContinuousClock.now
            if let readyFile { _ = FileManager.default.createFile(atPath: readyFile, contents: nil) }
            let results = try await withThrowingTaskGroup(of: ([Double], Int, Int, Int).self) { group in
                for _ in 0..<connections {
                    group.addTask {
                        var latencies: [Double] = []
                        var accepted = 0
                        var failures = 0
                        var sentEvents = 0
                        while let index = next.take(below: bodies.count) {
                            if let stopFile, FileManager.default.fileExists(atPath: stopFile) { break }
                            // Paced: batch i is due at started + i / rate, whoever sends it, and its
                            // latency counts from then: a stall that delays the batches behind it
                            // shows in all of them, not only in the few in flight.
                            var due = ContinuousClock.now
                            if rate > 0 {
                                due = started + .milliseconds(Int64(Double(index - skip) * 1000 / rate))
                                if due > ContinuousClock.now { try await Task.sleep(until: due, clock: .continuous) }
                            }
                            var request = HTTPClientRequest(url: baseURL + "/v1/events")
                            request.method = .POST
                            request.headers.add(name: "Authorization", value: "Bearer \(bodies[index].key)")
                            request.headers.add(name: "Content-Type", value: "application/json")
                            // Each batch is sent once, and says so as AdTallyKit does for a batch it
                            // never sent: the server claims its ids without probing for known ones.
                            request.headers.add(name: "AdTally-Attempt", value: "1")
                            request.body = .bytes(bodies[index].body)
                            let sent = rate > 0 ? min(due, ContinuousClock.now) : ContinuousClock.now
                            sentEvents += bodies[index].events
                            let response = try await client.execute(request, timeout: .seconds(30))
                            let body = try await response.body.collect(upTo: 1 << 20)
                            let elapsed = ContinuousClock.now - sent
                            latencies.append(Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15)
                            if response.status == .ok {
                                let text = String(buffer: body)
                                if let range = text.range(of: "\"accepted\":") {
                                    accepted += Int(text[range.upperBound...].prefix { $0.isNumber }) ?? 0
                                }
                            } else {
                                failures += 1
                            }
                        }
                        return (latencies, accepted, failures, sentEvents)
                    }
                }
                return try await group.reduce(into: [([Double], Int, Int, Int)]()) { $0.append($1) }
            }
            let elapsed = ContinuousClock.now - started
            let driverCPU = Self.cpuSeconds() - cpuBefore
            try await client.shutdown()
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            let latencies = results.flatMap(\.0).sorted()
            let accepted = results.map(\.1).reduce(0, +)
            let failures = results.map(\.2).reduce(0, +)
            let sent = results.map(\.3).reduce(0, +)
            func percentile(_ p: Double) -> Double { latencies.isEmpty ? 0 : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] }
            print("events_sent=\(sent)")
            print("events_accepted=\(accepted)")
            print("failed_requests=\(failures)")
            print("seconds=\(String(format: "%.3f", seconds))")
            print("events_per_second=\(String(format: "%.0f", Double(accepted) / seconds))")
            print("ack_latency_p50_ms=\(String(format: "%.1f", percentile(0.50)))")
            print("ack_latency_p99_ms=\(String(format: "%.1f", percentile(0.99)))")
            print("ack_latency_max_ms=\(String(format: "%.1f", latencies.last ?? 0))")
            print("batches_sent=\(latencies.count)")
            print("driver_cpu_seconds=\(String(format: "%.2f", driverCPU))")
            if let serverPID, let status = try? String(contentsOfFile: "/proc/\(serverPID)/status", encoding: .utf8),
               let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }) {
                print("server_peak_rss_kb=\(line.split(separator: " ").dropFirst().first ?? "?")")
            }
        }
    }
}

extension Bench.Drive {
    /// User + system CPU time of this process so far.
    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}

/// Hands out batch indexes to the connections.
final class Counter: Sendable {
    private let value: Mutex<Int>
    init(start: Int = 0) { value = Mutex(start) }
    func take(below bound: Int) -> Int? {
        value.withLock { value in
            guard value < bound else { return nil }
            defer { value += 1 }
            return value
        }
    }
}

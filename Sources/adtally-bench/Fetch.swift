import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import Synchronization

extension Bench {
    /// The read side of `make bench-report`: repeated report calls over one keep-alive
    /// connection (latency percentiles), or one streamed download (rows/s, server RSS).
    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "GET a URL repeatedly; print latency percentiles, rows/s and the server's RSS.")
        @Option(help: "Full URL, query included.") var url: String
        @Option(help: "Bearer key.") var key: String
        @Option(help: "Calls, one after another (the first is a warm-up, not counted).") var count = 200
        @Option(help: "Prefix of the printed keys.") var name = "report"
        @Option(help: "Server process id: sample its RSS during the calls.") var serverPID: Int32?

        func run() async throws {
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            let sampler = serverPID.map { RSSSampler(pid: $0) }
            let idle = sampler?.current() ?? 0
            let cpuBefore = sampler?.cpuSeconds() ?? 0
            sampler?.start()
            var latencies: [Double] = []
            var rows = 0, bytes = 0
            var seconds = 0.0
            for call in 0...count {
                var request = HTTPClientRequest(url: url)
                request.headers.add(name: "Authorization", value: "Bearer \(key)")
                let started = ContinuousClock.now
                let response = try await client.execute(request, timeout: .seconds(600))
                guard response.status == .ok else {
                    let body = try await response.body.collect(upTo: 1 << 20)
                    throw ValidationError("\(response.status): \(String(buffer: body))")
                }
                var callRows = 0, callBytes = 0
                for try await chunk in response.body {
                    callBytes += chunk.readableBytes
                    callRows += chunk.readableBytesView.reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
                }
                let elapsed = ContinuousClock.now - started
                let milliseconds = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
                if call > 0 || count == 0 {
                    latencies.append(milliseconds)
                    rows = callRows
                    bytes = callBytes
                    seconds += milliseconds / 1000
                }
            }
            let peak = sampler?.stop() ?? 0
            let serverCPU = (sampler?.cpuSeconds() ?? 0) - cpuBefore
            try await client.shutdown()
            latencies.sort()
            func percentile(_ p: Double) -> Double { latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] }
            print("\(name)_calls=\(latencies.count)")
            print("\(name)_p50_ms=\(String(format: "%.2f", percentile(0.5)))")
            print("\(name)_p99_ms=\(String(format: "%.2f", percentile(0.99)))")
            print("\(name)_bytes=\(bytes)")
            print("\(name)_lines=\(rows)")
            if latencies.count == 1 { print("\(name)_lines_per_s=\(String(format: "%.0f", Double(rows) / seconds))") }
            if sampler != nil {
                print("\(name)_server_idle_rss_mb=\(String(format: "%.1f", Double(idle) / 1024))")
                print("\(name)_server_peak_rss_mb=\(String(format: "%.1f", Double(peak) / 1024))")
                print("\(name)_server_cpu_seconds=\(String(format: "%.2f", serverCPU))")
            }
        }
    }
}

/// Samples a process's resident set (VmRSS) every 10 ms and keeps the highest.
final class RSSSampler: Sendable {
    let pid: Int32
    private let peak = Mutex(0)
    private let running = Mutex(false)
    private let done = Mutex<Task<Void, Never>?>(nil)

    init(pid: Int32) { self.pid = pid }

    func current() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kb = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) else { return 0 }
        return kb
    }

    /// User + system CPU seconds of the process so far (/proc/PID/stat, clock ticks of 1/100 s).
    func cpuSeconds() -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / 100
    }

    func start() {
        running.withLock { $0 = true }
        let task = Task.detached { [self] in
            while running.withLock({ $0 }) {
                let now = current()
                peak.withLock { $0 = max($0, now) }
                try? await Task.sleep(for: .milliseconds(10))
            }
        }
        done.withLock { $0 = task }
    }

    func stop() -> Int {
        running.withLock { $0 = false }
        return peak.withLock { max($0, current()) }
    }
}

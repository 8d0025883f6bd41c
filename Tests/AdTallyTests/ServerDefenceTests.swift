@testable import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import PostgresKit
import Testing

/// A raw TCP connection to 127.0.0.1, for clients that misbehave on purpose.
final class RawConnection: @unchecked Sendable {
    let fd: Int32

    /// Connects from `source` (another loopback address is another client to the
    /// server); `receiveBuffer` bytes, when given, keep the kernel from buffering much
    /// of a response this client never reads.
    init(port: Int, from source: String? = nil, receiveBuffer: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else { throw TestSetupError(description: "cannot bind to \(source)") }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else { throw TestSetupError(description: "cannot connect to port \(port)") }
    }

    private var isClosed = false

    deinit { close() }

    func close() {
        if !isClosed { Glibc.close(fd) }
        isClosed = true
    }

    /// Sends bytes; false when the server closed the connection.
    @discardableResult
    func send(_ text: String) -> Bool {
        Array(text.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } > 0
    }

    /// Reads what arrives within `timeout`: the text, and whether the server closed the
    /// connection. The wait happens on a thread of its own: blocking one of the few
    /// cooperative threads for seconds starves the in-process servers (this test's own
    /// included), which then answer late under a loaded suite.
    func read(timeout: Duration, until marker: String? = nil) async -> (text: String, closed: Bool) {
        await onOwnThread { self.readBlocking(timeout: timeout, until: marker.map { Array($0.utf8) }) }
    }

    /// Reads at most `limit` bytes of what has arrived (waiting up to a second for some):
    /// how many, and whether the server closed the connection. A reader that trickles.
    func readSome(_ limit: Int) async -> (count: Int, closed: Bool) {
        await onOwnThread {
            var poller = pollfd(fd: self.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 1000) > 0 else { return (0, false) }
            var chunk = [UInt8](repeating: 0, count: limit)
            let count = recv(self.fd, &chunk, limit, 0)
            return count <= 0 ? (0, true) : (count, false)
        }
    }

    private func readBlocking(timeout: Duration, until marker: [UInt8]?) -> (text: String, closed: Bool) {
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let left = deadline - ContinuousClock.now
            let milliseconds = Int32(max(1, left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
            guard poll(&poller, 1, milliseconds) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &chunk, chunk.count, 0)
            if count <= 0 { return (String(decoding: received, as: UTF8.self), true) }
            received += chunk[0..<count]
            if let marker, received.count >= marker.count, (0...(received.count - marker.count)).contains(where: { received[$0..<($0 + marker.count)].elementsEqual(marker) }) {
                return (String(decoding: received, as: UTF8.self), false)
            }
        }
        return (String(decoding: received, as: UTF8.self), false)
    }
}

@Suite("Slow, stalled and abusive HTTP clients")
struct ServerDefenceTests {
    @Test("a client that sends its head a byte at a time is closed after the idle timeout")
    func slowHead() async throws {
        try await withTestApp(flags: .init(httpIdleTimeoutSeconds: 1)) { _, client in
            let connection = try RawConnection(port: try #require(client.port))
            let started = ContinuousClock.now
            var closed = false
            // Bounds for a loaded machine (the whole suite on two cores): up to 20 s, with a
            // head long enough to last that long a byte at a time.
            for byte in "POST /v1/events HTTP/1.1\r\nHost: x\r\n" + String(repeating: "X-Pad: slow\r\n", count: 6) {
                if !connection.send(String(byte)) { closed = true; break }
                if await connection.read(timeout: .milliseconds(300)).closed { closed = true; break }
                if ContinuousClock.now - started > .seconds(20) { break }
            }
            #expect(closed, "the server kept a slow head open for \(ContinuousClock.now - started)")
        }
    }

    @Test("a body that stalls is dropped after the idle timeout; one that trickles gets 408 at the body deadline")
    func stalledAndTricklingBodies() async throws {
        try await withTestApp(flags: .init(httpIdleTimeoutSeconds: 1)) { services, client in
            let keys = try await Ingest.keys(services)
            let port = try #require(client.port)
            let head = "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(keys.ingest)\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            let stalled = try RawConnection(port: port)
            stalled.send(head + #"{"events":"#)
            // Closed after about a second; the bound leaves room for a loaded machine.
            #expect(await stalled.read(timeout: .seconds(20)).closed)
        }
        try await withTestApp(flags: .init(httpIdleTimeoutSeconds: 30, httpBodyTimeoutSeconds: 2)) { services, client in
            let keys = try await Ingest.keys(services)
            let port = try #require(client.port)
            let head = "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(keys.ingest)\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            let trickling = try RawConnection(port: port)
            trickling.send(head)
            var answer = ""
            let started = ContinuousClock.now
            while ContinuousClock.now - started < .seconds(10) {
                trickling.send(" ")
                let (text, closed) = await trickling.read(timeout: .milliseconds(250))
                answer += text
                if closed || answer.contains("\r\n\r\n") { break }
            }
            #expect(answer.hasPrefix("HTTP/1.1 408"), "got \(answer.prefix(80))")
            #expect(answer.contains("application/problem+json"))
            #expect(await trickling.read(timeout: .seconds(3)).closed)
        }
    }

    @Test("a client that leaves mid-body is a 499, not a server error")
    func clientLeavesMidBody() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            // The metrics registry is the process's: compare the 499 count before and after.
            @Sendable func count499() async throws -> Int {
                try await client.execute(uri: "/metrics", method: .get) { response in
                    let line = String(buffer: response.body).split(separator: "\n").first {
                        $0.hasPrefix("hb_requests_total") && $0.contains("/v1/events") && $0.contains(#"http_response_status_code="499""#)
                    }
                    return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
                }
            }
            let before = try await count499()
            let connection = try RawConnection(port: try #require(client.port))
            connection.send("POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(keys.ingest)\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"events\":[")
            try await Task.sleep(for: .milliseconds(200))
            shutdown(connection.fd, Int32(SHUT_WR))
            _ = await connection.read(timeout: .seconds(2))
            // Counted as 499 (other tests in this process may add their own meanwhile).
            var after = try await count499()
            for _ in 0..<50 where after <= before {
                try await Task.sleep(for: .milliseconds(100))
                after = try await count499()
            }
            #expect(after > before)
        }
    }

    @Test("connections past the cap wait until one closes")
    func connectionCap() async throws {
        try await withServeProcess(app: "cap", arguments: ["--max-connections", "2"]) { server, _, client in
            let port = server.port
            try await client.shutdown()
            try await Task.sleep(for: .seconds(1))  // the client's connection is gone
            // Timeouts of answers expected are generous: they only bound a failure.
            let first = try RawConnection(port: port)
            let second = try RawConnection(port: port)
            // Each read ends as soon as an answer's head is in, so they may be
            // generous: on a loaded machine the 15 s each read once waited in full ran out.
            first.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            second.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            let firstAnswer = await first.read(timeout: .seconds(60), until: "\r\n\r\n")
            #expect(firstAnswer.text.hasPrefix("HTTP/1.1 200"), "\(firstAnswer)")
            let secondAnswer = await second.read(timeout: .seconds(60), until: "\r\n\r\n")
            #expect(secondAnswer.text.hasPrefix("HTTP/1.1 200"), "\(secondAnswer)")
            let third = try RawConnection(port: port)  // the kernel's backlog accepts it
            third.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            let early = await third.read(timeout: .seconds(1))
            #expect(early.text.isEmpty && !early.closed, "\(early)")
            first.close()
            let thirdAnswer = await third.read(timeout: .seconds(60), until: "\r\n\r\n")
            #expect(thirdAnswer.text.hasPrefix("HTTP/1.1 200"), "\(thirdAnswer)")
        }
    }

    @Test("NIO's own refusals are problem+json too: oversized head 431, Content-Length with Transfer-Encoding 400")
    func parserErrors() async throws {
        try await withTestApp { _, client in
            let port = try #require(client.port)
            let huge = try RawConnection(port: port)
            huge.send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: \(String(repeating: "a", count: 100_000))\r\n\r\n")
            let hugeAnswer = await huge.read(timeout: .seconds(3)).text
            #expect(hugeAnswer.hasPrefix("HTTP/1.1 431"), "got \(hugeAnswer.prefix(60))")
            #expect(hugeAnswer.contains("application/problem+json"))
            let smuggled = try RawConnection(port: port)
            smuggled.send("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            let answer = await smuggled.read(timeout: .seconds(3)).text
            #expect(answer.hasPrefix("HTTP/1.1 400"), "got \(answer)")
            #expect(answer.contains("application/problem+json"))
            #expect(answer.contains("Content-Length together with Transfer-Encoding"))
        }
    }

    @Test("a flood of unknown keys does not stop valid ingest, and costs no lookup when it cannot be a key")
    func unknownKeyFlood() async throws {
        try await withTestApp(flags: .init(poolSize: 2)) { services, client in
            let keys = try await Ingest.keys(services)
            let results = try await withThrowingTaskGroup(of: (valid: Bool, status: HTTPResponse.Status).self) { group in
                var results: [(valid: Bool, status: HTTPResponse.Status)] = []
                for index in 0..<1200 {
                    // The test client pipelines every request on one connection, which the
                    // server answers in order, and each request's 20 s read timeout runs from
                    // when it was sent: 64 queued timed out once on a loaded machine (64
                    // answers at 0.3 s). 8 queued give the server the same stream of requests.
                    if index >= 8, let result = try await group.next() { results.append(result) }
                    group.addTask {
                        let valid = index % 40 == 0
                        let secret = valid ? keys.ingest : "atk_" + AppStoreKeys.randomHex(24)
                        let body = Ingest.body([Ingest.event()])
                        return try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(secret), body: body) { response in
                            (valid, response.status)
                        }
                    }
                }
                for try await result in group { results.append(result) }
                return results
            }
            #expect(results.filter(\.valid).allSatisfy { $0.status == .ok })
            #expect(results.filter { !$0.valid }.allSatisfy { $0.status == .unauthorized })
            // A token that cannot be a key is refused without a query.
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers("not-a-key"), body: Ingest.body([])) { response in
                #expect(response.status == .unauthorized)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == results.filter(\.valid).count)
        }
    }

    @Test("small refusals: 405 with Allow, HEAD, 413 admin bodies, 404 for an unknown app's keys, app names checked")
    func smallRefusals() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            try await client.execute(uri: "/healthz", method: .post) { response in
                #expect(response.status == .methodNotAllowed)
                #expect(response.headers[.allow] == "GET, HEAD")
                #expect(response.headers[.contentType] == "application/problem+json")
            }
            try await client.execute(uri: "/v1/keys/key_x", method: .get, headers: [.authorization: "Bearer \(keys.admin)"]) { response in
                #expect(response.status == .methodNotAllowed)
                #expect(response.headers[.allow] == "DELETE")
            }
            try await client.execute(uri: "/nothing/here", method: .get) { response in
                #expect(response.status == .notFound)
            }
            try await client.execute(uri: "/healthz", method: .head) { response in
                #expect(response.status == .ok)
            }
            let admin: HTTPFields = [.authorization: "Bearer \(keys.admin)", .contentType: "application/json"]
            let big = ByteBuffer(string: #"{"app":"big","name":"\#(String(repeating: "n", count: 70_000))"}"#)
            try await client.execute(uri: "/v1/apps", method: .post, headers: admin, body: big) { response in
                #expect(response.status == .contentTooLarge)
            }
            try await client.execute(uri: "/v1/apps/nosuchapp/keys", method: .get, headers: admin) { response in
                #expect(response.status == .notFound)
            }
            for name in [#"a\u0000b"#, String(repeating: "n", count: 201)] {
                try await client.execute(uri: "/v1/apps", method: .post, headers: admin, body: ByteBuffer(string: #"{"app":"named","name":"\#(name)"}"#)) { response in
                    #expect(response.status == .badRequest)
                    #expect(String(buffer: response.body).contains("name: must"))
                }
            }
        }
    }

    @Test("readiness reports rollup compaction that keeps failing")
    func compactionFailureInReadiness() async throws {
        try await withServices { services in
            let readiness = DatabaseReadiness(database: services.database, compaction: services.compactor.health, compactionGrace: .zero)
            #expect(await readiness.notReadyReason() == nil)
            try await services.database.pool.query("ALTER TABLE rollup_15m_compacted RENAME TO broken")
            await #expect(throws: PostgresError.self) { try await services.compactor.compactOnce() }
            services.compactor.health.failed(PostgresError(kind: .server, message: "relation does not exist"))
            try await Task.sleep(for: .milliseconds(10))
            let reason = await readiness.notReadyReason()
            #expect(reason?.contains("rollup compaction has failed") == true)
            services.compactor.health.succeeded()
            #expect(await readiness.notReadyReason() == nil)
        }
    }

    @Test("a batch retried with known ids logs no ERROR in PostgreSQL")
    func knownIDsLogNoError() async throws {
        let logPath = try #require(ProcessInfo.processInfo.environment["ADTALLY_TEST_POSTGRES_LOG"])
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let id = UUID()
            let batch = Ingest.body([Ingest.event(id), Ingest.event()])
            for expected in [1, 0] {
                try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: batch) { response in
                    let receipt = try Ingest.receipt(response)
                    #expect(receipt.accepted == expected * 2)
                }
            }
            let log = try String(contentsOfFile: logPath, encoding: .utf8)
            #expect(!log.lowercased().contains(id.uuidString.lowercased()))
        }
    }
}

/// Random key-shaped secrets, as AppStore makes them.
enum AppStoreKeys {
    static func randomHex(_ bytes: Int) -> String {
        (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
    }
}

@Suite("adtally serve refuses to linger")
struct ServeLifecycleTests {
    @Test("a port already in use fails at once, naming it")
    func portInUse() async throws {
        let (listener, port) = try loopbackSocket(listening: true)
        defer { close(listener) }
        // Migrated already: the server migrates before it binds, and under a loaded clean-clone
        // run, given an empty database, it was still running after the whole 30 s below.
        try await withMigratedDatabase { conninfo in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: adtallyBinary())
            process.arguments = ["serve", "--database-url", conninfo, "--port", "\(port)"]
            let errors = Pipe()
            process.standardError = errors
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            let started = ContinuousClock.now
            while process.isRunning && ContinuousClock.now - started < .seconds(30) { try await Task.sleep(for: .milliseconds(100)) }
            let running = process.isRunning
            if running { process.terminate() }
            #expect(!running, "adtally serve kept running with its port taken")
            process.waitUntilExit()
            #expect(process.terminationStatus != 0)
            let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(text.contains("127.0.0.1:\(port)") && text.contains("already in use"), "stderr: \(text)")
        }
    }

    @Test("SIGTERM with a request stalled mid-body exits within the shutdown deadline")
    func shutdownDeadline() async throws {
        try await withServeProcess(app: "stall", arguments: ["--shutdown-timeout", "2"]) { server, secret, _ in
            let port = server.port
            let stalled = try RawConnection(port: port)
            stalled.send("POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(secret)\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            try await Task.sleep(for: .milliseconds(300))
            let started = ContinuousClock.now
            kill(server.process.processIdentifier, SIGTERM)
            while server.process.isRunning && ContinuousClock.now - started < .seconds(20) { try await Task.sleep(for: .milliseconds(100)) }
            #expect(!server.process.isRunning, "still running \(ContinuousClock.now - started) after SIGTERM")
        }
    }
}

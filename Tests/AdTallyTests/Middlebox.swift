import AdTallyTestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A hostile middlebox of the tests' own between the kit and a real `adtally serve`:
/// it forwards requests (clean), or answers as captive portals, proxies, redirects,
/// stalled links and broken servers do. Plain sockets and one thread per connection, on
/// 127.0.0.1 only; each answer closes its connection. Stopped by `stop()`.
final class Middlebox: @unchecked Sendable {
    // @unchecked: `mode`, `seen` and `connections` are guarded by `lock`; the rest is immutable.

    /// How the middlebox answers.
    enum Mode: Sendable, Equatable {
        /// Forwards to the server and back, untouched.
        case clean
        /// Nothing listens (the connection is closed at once).
        case down
        /// Forwards ingest, then answers 200 with a receipt that names a negative index.
        case negativeIndex
        /// Forwards ingest, then answers a receipt that names index 0 twice.
        case duplicateIndex
        /// Does not forward; answers a well-formed receipt for one event, whatever the batch.
        case acceptedOne
        /// A 200 `text/html` login page, as captive portals answer anything.
        case captivePortal
        /// nginx's 413 page, whatever the size.
        case proxy413
        /// A 400 page of a proxy's (not AdTally's problem+json).
        case proxy400
        /// A 307 to another path of its own; a request that arrives there is recorded.
        case redirect
        /// A 200 JSON answer of `bytes` bytes, streamed without a length (read to the close).
        case huge(bytes: Int)
        /// The head of an answer, then nothing until the mode changes (or 60 s).
        case stall
        /// The head of an answer, then a byte a second.
        case drip
        /// The switch answers `{"enable_advertising": NAME}` with NAME as given (ingest forwarded).
        case switchNamed(String)
        /// The switch answers 304 whatever is held (ingest forwarded).
        case switch304
        /// The switch answers a 12 MiB network name (ingest forwarded).
        case switchHuge
    }

    let port: Int
    let upstreamPort: Int
    private let listener: Int32
    private let lock = NSLock()
    private var _mode: Mode = .clean
    private var seen: [(method: String, path: String)] = []
    private var attempts: [String] = []
    private var isStopped = false

    var mode: Mode {
        get { lock.withLock { _mode } }
        set { lock.withLock { _mode = newValue } }
    }

    /// Requests seen so far (method and path, the query dropped).
    var requests: [(method: String, path: String)] { lock.withLock { seen } }

    /// The `AdTally-Attempt` header of each `POST /v1/events` seen so far ("" when none).
    var ingestAttempts: [String] { lock.withLock { attempts } }

    init(upstreamPort: Int) throws {
        self.upstreamPort = upstreamPort
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw TestSetupError(description: "middlebox: cannot listen")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    func stop() {
        lock.withLock { isStopped = true }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    private var stopped: Bool { lock.withLock { isStopped } }

    private func acceptLoop() {
        while !stopped {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if stopped { return }
                continue
            }
            let thread = Thread { [self] in
                handle(client)
                close(client)
            }
            thread.start()
        }
    }

    // MARK: - One exchange

    private func handle(_ client: Int32) {
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let request = readRequest(client) else { return }
        let mode = self.mode
        lock.withLock {
            seen.append((request.method, request.path))
            if request.path == "/v1/events" { attempts.append(request.header("adtally-attempt") ?? "") }
        }
        if request.path.hasPrefix("/moved") {
            // Where a redirect points: AdTally would refuse a re-post cut short.
            send(client, answer(400, "application/problem+json", #"{"type":"about:blank","title":"Bad Request","status":400,"detail":"a redirected body"}"#))
            return
        }
        let isIngest = request.path == "/v1/events"
        let isSwitch = request.path == "/v1/mediation"
        switch mode {
        case .clean:
            forward(request, to: client)
        case .down:
            return
        case .negativeIndex where isIngest, .duplicateIndex where isIngest:
            guard let (_, body) = exchangeUpstream(request), let receipt = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
                  let accepted = receipt["accepted"] as? Int, let duplicates = receipt["duplicates"] as? Int else { return }
            let total = accepted + duplicates + ((receipt["rejected"] as? [Any])?.count ?? 0)
            let lie = mode == .negativeIndex
                ? #"{"accepted":\#(max(0, total - 1)),"duplicates":0,"rejected":[{"index":-1,"error":"boom"}]}"#
                : #"{"accepted":\#(max(0, total - 2)),"duplicates":0,"rejected":[{"index":0,"error":"one"},{"index":0,"error":"two"}]}"#
            send(client, answer(200, "application/json", lie))
        case .acceptedOne where isIngest:
            send(client, answer(200, "application/json", #"{"accepted":1,"duplicates":0,"rejected":[]}"#))
        case .captivePortal:
            send(client, answer(200, "text/html", "<html><body><form action=/login>Sign in to Hotel Wi-Fi</form></body></html>", server: "portal"))
        case .proxy413 where isIngest:
            send(client, answer(413, "text/html", "<html><head><title>413 Request Entity Too Large</title></head><body><center><h1>413 Request Entity Too Large</h1></center><hr><center>nginx</center></body></html>", server: "nginx"))
        case .proxy400 where isIngest:
            send(client, answer(400, "text/html", "<html><body><h1>400 Bad Request</h1></body></html>", server: "squid"))
        case .redirect where isIngest:
            send(client, Array("HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:\(port)/moved/v1/events\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8))
        case .huge(let bytes) where isIngest || isSwitch:
            send(client, Array("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n".utf8))
            let chunk = [UInt8](repeating: UInt8(ascii: " "), count: 1 << 20)
            var sent = 0
            while sent < bytes, send(client, chunk) { sent += chunk.count }
        case .stall where isIngest, .drip where isIngest:
            send(client, Array("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n".utf8))
            let end = Date().addingTimeInterval(60)
            while Date() < end, self.mode == mode, !stopped {
                if mode == .drip, !send(client, [UInt8(ascii: " ")]) { return }
                usleep(mode == .drip ? 1_000_000 : 100_000)
            }
        case .switchNamed(let name) where isSwitch:
            var body: [UInt8] = Array(#"{"enable_advertising":""#.utf8)
            body += Array(name.unicodeScalars.map { $0.value < 0x20 ? String(format: "\\u%04x", $0.value) : String($0) }.joined().utf8)
            body += Array(#""}"#.utf8)
            send(client, answer(200, "application/json", String(decoding: body, as: UTF8.self), extra: "ETag: \"lie\"\r\nCache-Control: max-age=0\r\n"))
        case .switch304 where isSwitch:
            send(client, Array("HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=0\r\nConnection: close\r\n\r\n".utf8))
        case .switchHuge where isSwitch:
            let name = String(repeating: "a", count: 12 << 20)
            send(client, answer(200, "application/json", #"{"enable_advertising":"\#(name)"}"#))
        default:
            forward(request, to: client)
        }
    }

    private struct Request {
        var method: String
        var path: String
        var head: [UInt8]
        var body: [UInt8]

        /// A header's value (`name` in lower case), trimmed.
        func header(_ name: String) -> String? {
            for line in String(decoding: head, as: UTF8.self).split(separator: "\r\n").dropFirst() {
                let parts = line.split(separator: ":", maxSplits: 1)
                if parts.count == 2, parts[0].lowercased() == name { return parts[1].trimmingCharacters(in: .whitespaces) }
            }
            return nil
        }
    }

    private func readRequest(_ fd: Int32) -> Request? {
        var data: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var headEnd: Int?
        while headEnd == nil {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            guard count > 0 else { return nil }
            data += buffer[0..<count]
            if let range = find(data, Array("\r\n\r\n".utf8)) { headEnd = range + 4 }
            if data.count > 1 << 20 { return nil }
        }
        let headText = String(decoding: data[0..<headEnd!], as: UTF8.self)
        let lines = headText.split(separator: "\r\n")
        let first = lines.first?.split(separator: " ") ?? []
        guard first.count >= 2 else { return nil }
        var length = 0
        for line in lines.dropFirst() {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "content-length" { length = Int(parts[1].trimmingCharacters(in: .whitespaces)) ?? 0 }
        }
        while data.count < headEnd! + length {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            guard count > 0 else { return nil }
            data += buffer[0..<count]
        }
        let path = String(first[1].split(separator: "?").first ?? "")
        return Request(method: String(first[0]), path: path, head: Array(data[0..<headEnd!]), body: Array(data[headEnd!..<(headEnd! + length)]))
    }

    /// The request sent on to the server with `Connection: close`; the whole answer, and its body.
    private func exchangeUpstream(_ request: Request) -> (answer: [UInt8], body: [UInt8])? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(upstreamPort).bigEndian
        let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard connected == 0 else { return nil }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let head = String(decoding: request.head, as: UTF8.self).split(separator: "\r\n")
            .filter { !$0.lowercased().hasPrefix("connection:") }.joined(separator: "\r\n") + "\r\nConnection: close\r\n\r\n"
        guard send(fd, Array(head.utf8) + request.body) else { return nil }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            guard count > 0 else { break }
            answer += buffer[0..<count]
        }
        guard let end = find(answer, Array("\r\n\r\n".utf8)) else { return nil }
        return (answer, Array(answer[(end + 4)...]))
    }

    private func forward(_ request: Request, to client: Int32) {
        guard let (answer, _) = exchangeUpstream(request) else { return }
        send(client, answer)
    }

    private func answer(_ status: Int, _ type: String, _ body: String, server: String? = nil, extra: String = "") -> [UInt8] {
        let reason = [200: "OK", 400: "Bad Request", 413: "Request Entity Too Large"][status] ?? "Status"
        let bytes = Array(body.utf8)
        let head = "HTTP/1.1 \(status) \(reason)\r\nContent-Type: \(type)\r\nContent-Length: \(bytes.count)\r\n\(server.map { "Server: \($0)\r\n" } ?? "")\(extra)Connection: close\r\n\r\n"
        return Array(head.utf8) + bytes
    }

    /// Writes all of `bytes`; false when the peer went away.
    @discardableResult
    private func send(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var done = 0
        while done < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + done, $0.count - done, Int32(MSG_NOSIGNAL)) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            done += count
        }
        return true
    }

    private func find(_ haystack: [UInt8], _ needle: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for index in 0...(haystack.count - needle.count) where haystack[index] == needle[0] && Array(haystack[index..<(index + needle.count)]) == needle {
            return index
        }
        return nil
    }
}

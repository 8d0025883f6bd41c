#if os(Linux)
import AdTallyKitCurl
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One request through libcurl (Linux), on a thread of its own: the answer's body is
/// taken by curl's write callback, which refuses the first byte past the cap (curl then
/// stops reading the connection), its headers by the header callback within 64 KiB, the
/// whole exchange bounded by `CURLOPT_TIMEOUT_MS`, redirects not followed (curl's
/// default), and a cancelled task stops at curl's next progress call.
final class CurlExchange: @unchecked Sendable {
    // @unchecked: the fields the callbacks write are written only on the request's own
    // thread; `isCancelled` is read there and set from any thread under `lock`.
    private let cap: Int
    private var body: [UInt8] = []
    private var headerLines: [String] = []
    private var headerBytes = 0
    private var isTooLarge = false
    private var headersTooLarge = false
    private let lock = NSLock()
    private var cancelled = false

    static let maxHeaderBytes = 64 << 10

    private init(cap: Int) { self.cap = cap }

    private static let globalInit: Void = { _ = curl_global_init(Int(CURL_GLOBAL_ALL)) }()

    /// See `Transport.exchange`.
    static func perform(_ request: URLRequest, maxBytes: Int, deadline: TimeInterval) async -> Result<WireAnswer, WireFailure> {
        _ = globalInit
        let exchange = CurlExchange(cap: maxBytes)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<WireAnswer, WireFailure>, Never>) in
                let thread = Thread {
                    continuation.resume(returning: exchange.run(request, deadline: deadline))
                }
                thread.name = "adtally.request"
                thread.stackSize = 256 << 10
                thread.start()
            }
        } onCancel: {
            exchange.lock.locked { exchange.cancelled = true }
        }
    }

    private var isCancelled: Bool { lock.locked { cancelled } }

    /// Handles kept between requests, reset, so that their connections are kept alive
    /// (`curl_easy_reset` keeps a handle's live connections and DNS cache): at most two,
    /// as the kit makes at most a batch and a switch fetch at once per server.
    private static let pool = HandlePool()

    private final class HandlePool: @unchecked Sendable {
        // @unchecked: `handles` is read and written under `lock` only.
        private let lock = NSLock()
        private var handles: [UnsafeMutableRawPointer] = []

        func take() -> UnsafeMutableRawPointer? {
            lock.locked { handles.popLast() } ?? curl_easy_init()
        }

        func give(_ handle: UnsafeMutableRawPointer) {
            curl_easy_reset(handle)
            let kept = lock.locked { () -> Bool in
                guard handles.count < 2 else { return false }
                handles.append(handle)
                return true
            }
            if !kept { curl_easy_cleanup(handle) }
        }
    }

    private func run(_ request: URLRequest, deadline: TimeInterval) -> Result<WireAnswer, WireFailure> {
        guard let url = request.url?.absoluteString, let handle = Self.pool.take() else { return .failure(.unreachable("cannot start a request")) }
        defer { Self.pool.give(handle) }
        var headers: UnsafeMutablePointer<curl_slist>?
        defer { curl_slist_free_all(headers) }
        for (name, value) in request.allHTTPHeaderFields ?? [:] {
            headers = curl_slist_append(headers, "\(name): \(value)")
        }
        // No `Expect: 100-continue` round trip before a batch.
        headers = curl_slist_append(headers, "Expect:")
        let milliseconds = Int(max(0.01, min(deadline, 86_400)) * 1000)
        let context = Unmanaged.passUnretained(self).toOpaque()
        var code = url.withCString { adtally_curl_set_pointer(handle, CURLOPT_URL, $0) }
        code = code == CURLE_OK ? adtally_curl_set_long(handle, CURLOPT_NOSIGNAL, 1) : code
        code = code == CURLE_OK ? adtally_curl_set_long(handle, CURLOPT_TIMEOUT_MS, milliseconds) : code
        code = code == CURLE_OK ? adtally_curl_set_long(handle, CURLOPT_FOLLOWLOCATION, 0) : code
        code = code == CURLE_OK ? adtally_curl_set_pointer(handle, CURLOPT_HTTPHEADER, headers) : code
        code = code == CURLE_OK ? adtally_curl_set_data_callback(handle, CURLOPT_WRITEFUNCTION, curlBody) : code
        code = code == CURLE_OK ? adtally_curl_set_pointer(handle, CURLOPT_WRITEDATA, context) : code
        code = code == CURLE_OK ? adtally_curl_set_data_callback(handle, CURLOPT_HEADERFUNCTION, curlHeader) : code
        code = code == CURLE_OK ? adtally_curl_set_pointer(handle, CURLOPT_HEADERDATA, context) : code
        code = code == CURLE_OK ? adtally_curl_set_progress_callback(handle, curlProgress) : code
        code = code == CURLE_OK ? adtally_curl_set_pointer(handle, CURLOPT_XFERINFODATA, context) : code
        code = code == CURLE_OK ? adtally_curl_set_long(handle, CURLOPT_NOPROGRESS, 0) : code
        if code == CURLE_OK, request.httpMethod == "POST" {
            let body = request.httpBody ?? Data()
            code = adtally_curl_set_long(handle, CURLOPT_POST, 1)
            code = code == CURLE_OK ? adtally_curl_set_size(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)) : code
            // Copied by curl: the data need not outlive this call.
            code = code == CURLE_OK ? body.withUnsafeBytes { adtally_curl_set_pointer(handle, CURLOPT_COPYPOSTFIELDS, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1)) } : code
        }
        if code == CURLE_OK, let method = request.httpMethod, method != "POST", method != "GET" {
            // DELETE (the erasure of a forgotten install): a request without a body.
            code = method.withCString { adtally_curl_set_pointer(handle, CURLOPT_CUSTOMREQUEST, $0) }
        }
        guard code == CURLE_OK else { return .failure(.unreachable("cannot set up the request (\(String(cString: curl_easy_strerror(code))))")) }
        let result = curl_easy_perform(handle)
        if isTooLarge { return .failure(.tooLarge(cap: cap)) }
        if headersTooLarge { return .failure(.tooLarge(cap: Self.maxHeaderBytes)) }
        if result == CURLE_OPERATION_TIMEDOUT { return .failure(.deadline(Double(milliseconds) / 1000)) }
        guard result == CURLE_OK else { return .failure(.unreachable(String(cString: curl_easy_strerror(result)))) }
        var status = 0
        _ = adtally_curl_response_code(handle, &status)
        var fields: [String: String] = [:]
        for line in headerLines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()
            fields[name] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespacesAndNewlines)
        }
        return .success(WireAnswer(status: status, headers: fields, body: Data(body)))
    }

    fileprivate func take(body pointer: UnsafeMutablePointer<CChar>, count: Int) -> Int {
        guard body.count + count <= cap else {
            isTooLarge = true
            return 0  // curl stops: CURLE_WRITE_ERROR
        }
        pointer.withMemoryRebound(to: UInt8.self, capacity: count) { body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count)) }
        return count
    }

    fileprivate func take(header pointer: UnsafeMutablePointer<CChar>, count: Int) -> Int {
        headerBytes += count
        guard headerBytes <= Self.maxHeaderBytes else {
            headersTooLarge = true
            return 0
        }
        let line = pointer.withMemoryRebound(to: UInt8.self, capacity: count) { String(decoding: UnsafeBufferPointer(start: $0, count: count), as: UTF8.self) }
        // A new status line (after a 100 Continue): the headers are the final answer's.
        if line.hasPrefix("HTTP/") { headerLines = [] } else { headerLines.append(line) }
        return count
    }

    fileprivate var shouldStop: Bool { isCancelled }
}

private let curlBody: adtally_curl_data_callback = { pointer, size, count, context in
    guard let pointer, let context else { return 0 }
    return Unmanaged<CurlExchange>.fromOpaque(context).takeUnretainedValue().take(body: pointer, count: size * count)
}

private let curlHeader: adtally_curl_data_callback = { pointer, size, count, context in
    guard let pointer, let context else { return 0 }
    return Unmanaged<CurlExchange>.fromOpaque(context).takeUnretainedValue().take(header: pointer, count: size * count)
}

private let curlProgress: adtally_curl_progress_callback = { context, _, _, _, _ in
    guard let context else { return 0 }
    return Unmanaged<CurlExchange>.fromOpaque(context).takeUnretainedValue().shouldStop ? 1 : 0
}
#endif

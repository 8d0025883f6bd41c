import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One answer read off the network: its status, the headers the kit reads, and a body
/// no larger than the cap the request was sent with.
struct WireAnswer: Sendable {
    var status: Int
    /// Header values by lower-cased name.
    var headers: [String: String]
    var body: Data

    func header(_ name: String) -> String? { headers[name.lowercased()] }

    /// The media type of `Content-Type`, lower-cased, without its parameters ("" when absent).
    var mediaType: String {
        let value = header("content-type") ?? ""
        return String(value.split(separator: ";", maxSplits: 1).first ?? "").trimmingCharacters(in: .whitespaces).lowercased()
    }
}

/// Why no answer was read.
enum WireFailure: Error, Equatable, CustomStringConvertible {
    /// The connection failed or was cut (offline, refused, reset, a TLS error).
    case unreachable(String)
    /// The answer's body was larger than the cap: read no further.
    case tooLarge(cap: Int)
    /// The whole exchange (connect, send, the answer to its last byte) took longer than allowed.
    case deadline(TimeInterval)

    var description: String {
        switch self {
        case .unreachable(let text): "cannot reach the server: \(text)"
        case .tooLarge(let cap): "an answer larger than \(cap / 1024) KiB (not AdTally's): read no further"
        case .deadline(let seconds): "no whole answer within \(Int(seconds)) s (a stalled or dripping link): cut"
        }
    }
}

/// Every request the kit makes: each with a cap on the answer's body (larger is a
/// failure, and the kit stops reading at the cap), a total deadline (connect, send and
/// the whole answer; the request's own timeout is only an idle one), and no redirect
/// followed (the 3xx itself is the answer, for the caller to judge).
///
/// On Apple platforms, one URLSession of the process with a data delegate that stops
/// the task at the cap. On Linux, libcurl driven directly (Transport+Curl.swift):
/// FoundationNetworking hands a body to its delegate through the delegate queue with
/// no back-pressure, so over a fast link a 200 MiB answer was wholly queued in memory
/// (623 MB peak in the kit's child) before the delegate could stop it at the cap;
/// libcurl's own write callback refuses the first byte past the cap.
final class Transport: @unchecked Sendable {
    // @unchecked: `session` is made once under `sessionLock` and URLSession is
    // thread-safe; the exchanges are guarded by the delegate's lock.
    static let shared = Transport()

    private let delegate = Delegate()

    /// One URLSession for every engine of the process: a session costs memory of its own
    /// (on Linux, libcurl's: a probe went from 24 to 29.6 MiB creating one), and its
    /// connections are shared. Made at the first request that uses it.
    private lazy var session: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 2
        configuration.urlCache = nil
        // A captive portal's cookie is nothing the kit should send back.
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        queue.name = "adtally.transport"
        return URLSession(configuration: configuration, delegate: delegate, delegateQueue: queue)
    }()
    private let sessionLock = NSLock()

    private init() {}

    /// Sends `request` and reads its answer, at most `maxBytes` of body, within `deadline`
    /// seconds in all. Cancelling the calling task cancels the request.
    func exchange(_ request: URLRequest, maxBytes: Int, deadline: TimeInterval) async -> Result<WireAnswer, WireFailure> {
        #if os(Linux)
        return await CurlExchange.perform(request, maxBytes: maxBytes, deadline: deadline)
        #else
        return await sessionExchange(request, maxBytes: maxBytes, deadline: deadline)
        #endif
    }

    /// `exchange` through URLSession (Apple platforms).
    func sessionExchange(_ request: URLRequest, maxBytes: Int, deadline: TimeInterval) async -> Result<WireAnswer, WireFailure> {
        let exchange = Exchange(cap: maxBytes)
        let session = sessionLock.locked { self.session }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<WireAnswer, WireFailure>, Never>) in
                let task = session.dataTask(with: request)
                delegate.register(task.taskIdentifier, exchange)
                // Cancelled already: answered at once, and the task is never started.
                guard exchange.attach(continuation, task: task) else { return }
                let seconds = max(0.01, min(deadline, 86_400))
                DispatchQueue.global(qos: .utility).asyncAfter(deadline: .now() + seconds) { [weak exchange] in
                    exchange?.finish(.failure(.deadline(seconds)))
                }
                task.resume()
            }
        } onCancel: {
            exchange.finish(.failure(.unreachable("cancelled")))
        }
    }

    /// One request's state until it has its result, which it takes exactly once.
    final class Exchange: @unchecked Sendable {
        // @unchecked: every field is read and written under `lock`.
        private let lock = NSLock()
        let cap: Int
        private var continuation: CheckedContinuation<Result<WireAnswer, WireFailure>, Never>?
        private var task: URLSessionTask?
        /// A result taken before the caller was attached (a cancellation that came first).
        private var early: Result<WireAnswer, WireFailure>?
        private var response: HTTPURLResponse?
        private var body = Data()
        private var isFinished = false
        private var onFinish: (() -> Void)?

        /// Called once, when the exchange has its result (the delegate forgets it then).
        func whenFinished(_ body: @escaping () -> Void) { lock.locked { onFinish = body } }

        init(cap: Int) { self.cap = cap }

        /// The caller to resume and the task to stop; false (the caller resumed) when the
        /// exchange already has its result.
        func attach(_ continuation: CheckedContinuation<Result<WireAnswer, WireFailure>, Never>, task: URLSessionTask) -> Bool {
            let early = lock.locked { () -> Result<WireAnswer, WireFailure>? in
                if let early = self.early { return early }
                self.continuation = continuation
                self.task = task
                return nil
            }
            guard let early else { return true }
            lock.locked { onFinish }?()
            continuation.resume(returning: early)
            return false
        }

        /// The answer's head; false when its stated length is already over the cap.
        func received(_ response: HTTPURLResponse) -> Bool {
            lock.locked { self.response = response }
            if response.expectedContentLength > Int64(cap) {
                finish(.failure(.tooLarge(cap: cap)))
                return false
            }
            return true
        }

        /// A piece of the body; past the cap the exchange fails and the task is cancelled.
        func received(_ data: Data) {
            let over = lock.locked { () -> Bool in
                guard !isFinished else { return false }
                if body.count + data.count > cap { return true }
                body.append(data)
                return false
            }
            if over { finish(.failure(.tooLarge(cap: cap))) }
        }

        func completed(_ error: (any Error)?) {
            if let error {
                finish(.failure(.unreachable(error.localizedDescription)))
                return
            }
            let answer = lock.locked { () -> WireAnswer? in
                guard let response else { return nil }
                var headers: [String: String] = [:]
                for (name, value) in response.allHeaderFields {
                    if let name = name as? String, let value = value as? String { headers[name.lowercased()] = value }
                }
                return WireAnswer(status: response.statusCode, headers: headers, body: body)
            }
            finish(answer.map { .success($0) } ?? .failure(.unreachable("not an HTTP answer")))
        }

        /// Resumes the caller with `result` (the first result only) and stops the task.
        func finish(_ result: Result<WireAnswer, WireFailure>) {
            let taken = lock.locked { () -> (CheckedContinuation<Result<WireAnswer, WireFailure>, Never>?, URLSessionTask?, (() -> Void)?) in
                guard !isFinished else { return (nil, nil, nil) }
                isFinished = true
                body = Data()
                guard continuation != nil else {
                    early = result
                    return (nil, nil, nil)
                }
                defer { continuation = nil; onFinish = nil; task = nil }
                return (continuation, task, onFinish)
            }
            guard let continuation = taken.0 else { return }
            taken.2?()
            if case .success = result {} else { taken.1?.cancel() }
            continuation.resume(returning: result)
        }
    }

    /// The session's delegate: routes each task's events to its exchange.
    private final class Delegate: NSObject, URLSessionDataDelegate, @unchecked Sendable {
        // @unchecked: `exchanges` is read and written under `lock` only.
        private let lock = NSLock()
        private var exchanges: [Int: Exchange] = [:]

        func register(_ id: Int, _ exchange: Exchange) {
            lock.locked { exchanges[id] = exchange }
            exchange.whenFinished { [weak self] in self?.lock.locked { _ = self?.exchanges.removeValue(forKey: id) } }
        }

        private func exchange(_ task: URLSessionTask) -> Exchange? {
            lock.locked { exchanges[task.taskIdentifier] }
        }

        func urlSession(
            _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
            completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
        ) {
            guard let exchange = exchange(dataTask), let http = response as? HTTPURLResponse else {
                completionHandler(.cancel)
                return
            }
            completionHandler(exchange.received(http) ? .allow : .cancel)
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            guard let exchange = exchange(dataTask) else {
                dataTask.cancel()
                return
            }
            exchange.received(data)
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
            exchange(task)?.completed(error)
        }

        /// Redirects are not followed: a POST re-sent elsewhere may arrive cut short, and a
        /// redirect says the kit is configured with the wrong URL. The 3xx is the answer.
        func urlSession(
            _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
            newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void
        ) {
            completionHandler(nil)
        }
    }
}

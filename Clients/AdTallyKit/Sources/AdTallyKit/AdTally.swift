import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Settings of an `AdTally`; every default is stated here and in the kit's README.
public struct AdTallyConfiguration: Sendable {
    /// Most bytes the queue holds on disk (default 8 MiB, ~25,000 events). Beyond it the
    /// oldest segment's events are dropped, counted and reported.
    public var maxQueueBytes = 8 << 20
    /// Events older than this (by the device's clock) are dropped, counted, instead of
    /// sent (default 30 days). The server's own window (7 days) decides what it takes:
    /// older events come back as rejections with its reason. The kit's bound is wider, so
    /// that a clock set forward by days does not drop a whole queue the server would take.
    public var maxEventAge: TimeInterval = 30 * 86_400
    /// Size at which the queue starts a new segment file (default 256 KiB); the byte
    /// bound drops whole segments.
    public var segmentBytes = 256 << 10
    /// Most events per request (default and server limit 1,000).
    public var batchSize = 1000
    /// Most JSON bytes per request before gzip (default 512 KiB; the server's limit is 1 MiB).
    public var batchBytes = 512 << 10
    /// Send when this many events wait (default 100) ...
    public var sendAfterEvents = 100
    /// ... or when the oldest has waited this long (default 15 s), or at once on
    /// `flush()` and `enteredBackground()`.
    public var sendInterval: TimeInterval = 15
    /// First retry delay after a failure (default 1 s), doubled per failure up to `retryCap` (300 s), with jitter.
    public var retryBase: TimeInterval = 1
    public var retryCap: TimeInterval = 300
    /// How long one request may take in all — connecting, sending and reading the whole
    /// answer (default 30 s): a link that stalls or drips is cut then and retried.
    public var requestTimeout: TimeInterval = 30
    /// What power loss may take (a killed process loses nothing either way; see `Durability`).
    public var durability = Durability.syncEvery(1)
    /// Filled into every event; detected when nil (country from the locale, platform
    /// and OS from the system, app version from the bundle).
    public var country: String?
    public var platform: String?
    public var osVersion: String?
    public var appVersion: String?
    /// The network the switch answers before any answer was ever fetched: per
    /// placement, else `defaultNetwork` (compiled into the app).
    public var defaultNetworks: [String: String] = [:]
    public var defaultNetwork: String?
    /// Called with drops, rejections and a refused key, in order, on a serial background
    /// queue of the kit's (never on the thread that recorded).
    public var notices: (@Sendable (AdTallyNotice) -> Void)?
    /// Called with every misuse before it is thrown (e.g. `{ assertionFailure("\($0)") }` in debug builds).
    public var misuseHandler: (@Sendable (AdTallyError) -> Void)?

    /// The defaults.
    public init() {}
}

/// When recorded events reach the disk itself, not only the operating system.
public enum Durability: Sendable, Equatable {
    /// fsync at most once per interval (seconds), from the sender, and before a send:
    /// power loss or a kernel panic may lose the last interval's events. The default (1 s),
    /// because an fsync costs milliseconds on a phone's flash and `record` must not.
    case syncEvery(TimeInterval)
    /// fsync inside every `record`: nothing is lost even to power loss, at the cost of
    /// an fsync per event (see `make bench-client`).
    case syncEveryRecord
}

/// What the kit holds and has done, for an app's diagnostics.
public struct AdTallyStatus: Sendable, Equatable {
    /// Events on disk, not yet answered by the server.
    public var pending: Int
    /// Bytes of the queue on disk.
    public var pendingBytes: Int
    /// Events the server accepted (or already had) since this process opened the queue.
    public var delivered: Int
    /// Events dropped since the queue was opened, per reason.
    public var dropped: [DropReason: Int]
    /// Events the server refused for good (in the dead-letter file).
    public var deadLettered: Int
    /// Set while sending is stopped by a refused key.
    public var stoppedBy: Int?
    /// Requests sent, and how many were answered 413 (a batch split), 429/503, 304 (the switch).
    public var requests: Int
    public var splits: Int
    public var throttled: Int
    public var switchFetches: Int
    public var switchNotModified: Int
    /// Answers to batches that were not AdTally's (a captive portal, a proxy, a redirect):
    /// each was a failed attempt, retried.
    public var unexpectedAnswers: Int
    /// Events the server did not store because their install was erased after they
    /// occurred (among `delivered`: nothing to send again).
    public var erased: Int
    /// The user opted out (`optOut()`): nothing is recorded or sent until `optIn()`.
    public var isOptedOut: Bool
    /// Installs forgotten (`forgetInstall()`) whose erasure the server has not answered yet.
    public var forgetsPending: Int

    init() {
        (pending, pendingBytes, delivered, dropped, deadLettered, stoppedBy) = (0, 0, 0, [:], 0, nil)
        (requests, splits, throttled, switchFetches, switchNotModified, unexpectedAnswers) = (0, 0, 0, 0, 0, 0)
        (erased, isOptedOut, forgetsPending) = (0, false, 0)
    }
}

/// The app side of AdTally (DESIGN §10): events written to an on-disk queue before
/// `record` returns, sent in gzip batches, and removed only when the server's answer
/// names them, so that each is counted exactly once whatever happens to the process,
/// the network or the server in between; and the mediation switch, read from a cached
/// answer that never blocks the caller.
///
/// Instances naming the same `directory` in one process share one queue and one
/// sender; another process cannot open a folder in use (a file lock).
public final class AdTally: @unchecked Sendable {
    let engine: Engine

    /// Opens (or creates) the queue in `directory` (pass a folder under Application
    /// Support) and starts sending to `server` with the app's ingest key.
    public init(server: URL, appKey: String, directory: URL, configuration: AdTallyConfiguration = AdTallyConfiguration()) throws {
        engine = try Engine.open(server: server, appKey: appKey, directory: directory, configuration: configuration)
    }

    deinit { engine.release() }

    /// A slot for one banner, interstitial, native or rewarded ad of `network`.
    public func slot(network: String, format: AdFormat, placement: String? = nil, size: String? = nil) throws -> AdSlot {
        do {
            try EventRules.checkNetwork(network)
            if let placement { try EventRules.checkPlacement(placement) }
            if let size { try EventRules.checkSize(size) }
        } catch let error as AdTallyError {
            engine.reportMisuse(error)
            throw error
        }
        return AdSlot(owner: self, network: network, format: format, placement: placement, size: size)
    }

    /// The app came to the foreground: a session starts (a `session` event).
    @discardableResult
    public func sessionStarted() throws -> UUID {
        try engine.record(type: "session", network: nil, format: nil, placement: nil, size: nil) { _ in }
    }

    /// Returns once every event recorded before the call has a server answer (accepted,
    /// duplicate or rejected) or was dropped. Throws `sendingStopped` when the key is
    /// refused, and `CancellationError` when the task is cancelled; events stay queued.
    public func flush() async throws {
        try await engine.flush()
    }

    /// Call when the app goes to the background: the queue is synced to disk and a send starts.
    public func enteredBackground() {
        engine.enteredBackground()
    }

    /// Tries again after a refused key (for a key that was restored); a new instance does too.
    public func resumeSending() {
        engine.resumeSending()
    }

    /// The network to show for `placement` (and `country`) now: the last answer of the
    /// server's switch (`enable_advertising`), kept on disk and refreshed in the
    /// background when its `max-age` lapses; before any answer, the configured default.
    /// Never waits for the network.
    public func network(for placement: String = "default", country: String? = nil) -> String? {
        engine.switchboard.network(placement: placement, country: country)
    }

    /// Fetches the switch's answer for `placement` now (revalidating with its ETag), or
    /// waits for the fetch already under way, and returns the network it names; the
    /// last good answer or the default when it is unreachable or answers what AdTally
    /// could not have sent.
    public func refreshNetwork(for placement: String = "default", country: String? = nil) async -> String? {
        await engine.switchboard.refresh(placement: placement, country: country)
        return engine.switchboard.network(placement: placement, country: country, refreshing: false)
    }

    /// What the kit holds and has done.
    public var status: AdTallyStatus { engine.status }

    /// The per-install device id sent with every event (made once, kept in the folder; a
    /// new one after `forgetInstall()`).
    public var deviceID: String { engine.lock.locked { engine.currentDeviceID } }

    /// The user withdrew consent: from now on, and across launches until `optIn()`,
    /// recording calls return without writing or sending anything, and the events queued
    /// are dropped (counted as `optedOut`). The mediation switch still answers (it sends
    /// no event and no id).
    public func optOut() throws {
        try engine.setOptedOut(true)
    }

    /// Consent given again (after `optOut()`): recording and sending resume.
    public func optIn() throws {
        try engine.setOptedOut(false)
    }

    /// Forgets this install (the user asked for their data to be erased): drops the events
    /// queued (counted as `forgotten`), asks the server to erase everything it holds of
    /// the current id (sent with the app's key until the server answers, across launches),
    /// and starts a new id, which shares nothing with the old one.
    public func forgetInstall() throws {
        try engine.forgetInstall()
    }
}

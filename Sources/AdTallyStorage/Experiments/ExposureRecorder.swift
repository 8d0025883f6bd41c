import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// Records each device's first exposure to an experiment (DESIGN §14) without a write per
/// switch request: a server remembers the devices it has recorded (`seen`, at most
/// `maxSeen`; emptied when full, which costs each device one more idempotent write) and
/// queues the others (`pending`, at most `maxPending`), which `flush` writes in one
/// statement a second. A write keeps the earliest instant any server saw (servers flush
/// in any order). When the queue is full a device is not queued and not remembered: its
/// next request queues it again; each such miss is counted
/// (`adtally_experiment_exposures_deferred_total`), never silent.
public final class ExposureRecorder: Sendable {
    /// One exposure to write.
    struct Exposure: Sendable {
        var app: String
        var experiment: String
        var device: String
        var arm: ExperimentArm
        var at: Date
        var key: Key
    }

    /// 128 bits of a per-process keyed hash of (app, experiment, device): what `seen` keeps.
    struct Key: Hashable, Sendable {
        var a: Int
        var b: Int
    }

    struct State {
        var seen: Set<Key> = []
        var pending: [Exposure] = []
        /// Rows written since the table's statistics were last refreshed here, and when.
        var sinceAnalyze = 0
        var analyzedAt = ContinuousClock.now - .seconds(3600)
    }

    /// Devices remembered as recorded, and exposures queued, at most.
    public static let maxSeen = 1_000_000, maxPending = 100_000
    /// Exposures written per statement, at most.
    static let batch = 5_000

    let pool: PostgresPool
    let logger: Logger
    /// Devices remembered at most (`maxSeen`; smaller in tests).
    let seenLimit: Int
    private let state = Mutex(State())
    private let written = Counter(label: "adtally_experiment_exposures_total")
    private let deferred = Counter(label: "adtally_experiment_exposures_deferred_total")
    private let refused = Counter(label: "adtally_experiment_exposures_refused_total")

    /// A recorder writing to the primary's pool.
    public init(pool: PostgresPool, logger: Logger, seenLimit: Int = maxSeen) {
        self.pool = pool
        self.logger = logger
        self.seenLimit = seenLimit
    }

    static func key(app: String, experiment: String, device: String) -> Key {
        func hash(_ seed: Int) -> Int {
            var hasher = Hasher()
            hasher.combine(seed)
            hasher.combine(app)
            hasher.combine(experiment)
            hasher.combine(device)
            return hasher.finalize()
        }
        return Key(a: hash(0), b: hash(1))
    }

    /// Notes that a device got an answer under an experiment now; queued unless it was recorded.
    public func note(app: String, experiment: String, device: String, arm: ExperimentArm, at: Date = Date()) {
        let key = Self.key(app: app, experiment: experiment, device: device)
        let queued = state.withLock { state -> Bool in
            if state.seen.contains(key) { return true }
            guard state.pending.count < Self.maxPending else { return false }
            // Emptied when full: a device queued before may then be queued again (the write
            // keeps one row per device, the earliest).
            if state.seen.count >= seenLimit { state.seen.removeAll(keepingCapacity: true) }
            state.seen.insert(key)
            state.pending.append(Exposure(app: app, experiment: experiment, device: device, arm: arm, at: at, key: key))
            return true
        }
        if !queued { deferred.increment() }
    }

    /// Exposures queued and not written yet.
    public var pendingCount: Int { state.withLock { $0.pending.count } }

    /// One flush at a time: a flush that returns has written everything queued before it
    /// started, even when another (the service's) was writing some of it meanwhile.
    private let gate = SerialGate()

    /// Writes what is queued. On failure the exposures are queued again (as many as fit; the
    /// rest are forgotten as recorded, so their devices' next requests queue them) and it throws.
    public func flush() async throws {
        await gate.acquire()
        do {
            try await flushNow()
        } catch {
            await gate.release()
            throw error
        }
        await gate.release()
    }

    func flushNow() async throws {
        while true {
            let taken = state.withLock { state -> [Exposure] in
                let count = min(Self.batch, state.pending.count)
                defer { state.pending.removeFirst(count) }
                return Array(state.pending.prefix(count))
            }
            guard !taken.isEmpty else { return try await analyzeIfGrown() }
            var batch = taken
            do {
                do {
                    try await write(batch)
                } catch let error as PostgresError where error.sqlState == .foreignKeyViolation {
                    // An app deleted since: its exposures have nowhere to go; the others of
                    // the batch are written without them.
                    batch = try await existing(batch)
                    logger.warning("experiment exposures dropped: their app or experiment is gone", metadata: ["count": "\(taken.count - batch.count)", "error": "\(error)"])
                    if !batch.isEmpty { try await write(batch) }
                }
                written.increment(by: batch.count)
                state.withLock { $0.sinceAnalyze += batch.count }
            } catch let error as PostgresError where error.sqlState.map({ ["21", "22", "23"].contains(String($0.rawValue.prefix(2))) }) == true {
                // Data the database refuses whatever the retry: counted and logged, never
                // queued again (a batch retried for good would stop every later exposure).
                refused.increment(by: taken.count)
                logger.error("experiment exposures refused by the database; not retried", metadata: ["count": "\(taken.count)", "error": "\(error)"])
            } catch {
                state.withLock { state in
                    let room = max(0, Self.maxPending - state.pending.count)
                    state.pending.insert(contentsOf: taken.prefix(room), at: 0)
                    for lost in taken.dropFirst(room) { state.seen.remove(lost.key) }
                }
                throw error
            }
        }
    }

    /// A new experiment's exposures arrive by the thousand in its first minutes, before
    /// autovacuum's next look: the results' plan would see one row where there are
    /// thousands (their joins took 44 s instead of 0.3 for 4,000 devices). The table's
    /// statistics are refreshed after every 1,000 rows written, at most once a minute.
    func analyzeIfGrown() async throws {
        let due = state.withLock { state -> Bool in
            guard state.sinceAnalyze >= 1000, ContinuousClock.now - state.analyzedAt >= .seconds(60) else { return false }
            state.sinceAnalyze = 0
            state.analyzedAt = .now
            return true
        }
        if due { try await pool.query("ANALYZE experiment_exposures") }
    }

    /// The exposures whose experiment still exists.
    func existing(_ exposures: [Exposure]) async throws -> [Exposure] {
        let pairs = Set(exposures.map { $0.app + "\u{0}" + $0.experiment })
        var alive: Set<String> = []
        for pair in pairs {
            let parts = pair.split(separator: "\u{0}", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            if try await !pool.query("SELECT 1 FROM experiments WHERE app_id = \(parts[0]) AND name = \(parts[1])").isEmpty { alive.insert(pair) }
        }
        return exposures.filter { alive.contains($0.app + "\u{0}" + $0.experiment) }
    }

    func write(_ exposures: [Exposure]) async throws {
        // Epoch microseconds as text: one array per column, one statement.
        let micros = exposures.map { String(Int64(($0.at.timeIntervalSince1970 * 1_000_000).rounded())) }
        try await pool.query("""
            INSERT INTO experiment_exposures (app_id, experiment, device, arm, first_at)
            SELECT DISTINCT ON (x.app, x.experiment, x.device) x.app, x.experiment, x.device, x.arm, to_timestamp(x.micros::bigint / 1e6)
            FROM unnest(\(array: exposures.map(\.app))::text[], \(array: exposures.map(\.experiment))::text[], \(array: exposures.map(\.device))::text[],
                        \(array: exposures.map(\.arm.rawValue))::text[], \(array: micros)::text[]) AS x (app, experiment, device, arm, micros)
            -- A device twice in a batch (queued again after the memory of recorded ones was
            -- emptied): one row, its earliest exposure (ON CONFLICT cannot touch a row twice).
            ORDER BY x.app, x.experiment, x.device, x.micros::bigint
            ON CONFLICT (app_id, experiment, device) DO UPDATE SET first_at = excluded.first_at
            WHERE excluded.first_at < experiment_exposures.first_at
            """)
    }
}

/// An asynchronous lock: callers run one at a time, in the order they came.
actor SerialGate {
    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func acquire() async {
        guard busy else {
            busy = true
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    func release() {
        if waiters.isEmpty { busy = false } else { waiters.removeFirst().resume() }
    }
}

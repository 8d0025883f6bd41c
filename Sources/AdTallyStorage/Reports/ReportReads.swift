import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// Where the report engine reads: the primary, or a streaming replica
/// (`DATABASE_READ_URL`) while it is close enough behind.
///
/// Before each report the replica's replay position is compared with the primary's
/// WAL flush position read just before it: a replica that has replayed that far holds
/// everything committed when the report started (lag 0); otherwise its lag is the age
/// of the last transaction it replayed. That over-states the lag after the primary sat
/// idle (the last replayed commit is old although nothing newer exists beyond a few
/// bytes), which only ever sends a report to the primary, never a stale one to a client.
/// A replica that lags more than `maxLag`, is not a standby (promoted, or a wrong URL),
/// or cannot be reached is skipped for the primary, logged, and left alone for a few
/// seconds when unreachable. Writes never use these pools.
public final class ReportReads: Sendable {
    /// The primary's report pool: always there, and where writes' reads go.
    public let primary: PostgresPool
    /// The replica's pool, when one is configured.
    public let replica: PostgresPool?
    /// The most replay lag a report may read with.
    public let maxLag: Duration
    /// Where the primary's WAL position is read (not the report pool, which reports
    /// fill when they fall back to the primary).
    private let primaryProbe: PostgresPool
    private let logger: Logger
    private let state = Mutex(State())
    private let reportsStarted = Atomic<Int>(0)

    /// Reports started through these reads since they were made (tests check that a
    /// path they drive runs none).
    public var reportCount: Int { reportsStarted.load(ordering: .relaxed) }
    private let lagGauge = Gauge(label: "adtally_replica_lag_seconds")
    private let replicaReads = Counter(label: "adtally_report_reads_total", dimensions: [("server", "replica")])
    private let primaryReads = Counter(label: "adtally_report_reads_total", dimensions: [("server", "primary")])

    /// After a replica could not be reached, reports go to the primary for this long
    /// before it is tried again (a black-holed replica would otherwise cost every
    /// report a connect timeout).
    static let unreachableBackoff: Duration = .seconds(5)
    /// While the replica is skipped, the reason is logged again at most this often.
    static let skipLogInterval: Duration = .seconds(60)

    private struct State {
        var skipping = false
        var lastSkipLog: ContinuousClock.Instant?
        /// Until when the replica is not tried, and why.
        var backoff: (until: ContinuousClock.Instant, reason: String)?
        /// The probe in flight, if any.
        var probe: Task<Outcome, Never>?
        /// The last probe: when it started, and what it found.
        var lastProbe: (at: ContinuousClock.Instant, outcome: Outcome)?
    }

    /// Reads from `primary`, or from `replica` while it lags at most `maxLag`.
    public init(
        primary: PostgresPool, replica: PostgresPool? = nil, maxLag: Duration = .seconds(30), primaryProbe: PostgresPool? = nil,
        logger: Logger = Logger(label: "adtally.reports")
    ) {
        self.primary = primary
        self.primaryProbe = primaryProbe ?? primary
        self.replica = replica
        self.maxLag = maxLag
        self.logger = logger
        // The bound the lag is held to (the operators' rule AdTallyReplicaLagging compares them).
        if replica != nil { Gauge(label: "adtally_replica_max_lag_seconds").record(Self.seconds(maxLag)) }
    }

    /// The server a report reads from, and what its notes say about it.
    public struct Choice: Sendable {
        /// The pool to read with.
        public var pool: PostgresPool
        /// For the report's notes.
        public var readFrom: ReportNotes.ReadFrom
        /// Whether `pool` is the replica's.
        public var isReplica: Bool { readFrom.server == .replica }
    }

    /// Picks the server for one report from the replica's lag. One probe runs at a
    /// time and its answer serves the reports of the next `probeReuse`; the lag it
    /// reports is the measured one plus the time since, an upper bound (a replica
    /// only moves forward). A probe that has not answered within `probeDeadline`
    /// (a replica host gone silent, its connection waiting out TCP timeouts) sends
    /// reports to the primary meanwhile.
    public func choose() async -> Choice {
        guard let replica else { return Choice(pool: primary, readFrom: .init(server: .primary)) }
        let now = ContinuousClock.now
        let outcome: Outcome
        switch state.withLock({ state -> (Outcome, ContinuousClock.Instant)? in
            if let backoff = state.backoff, now < backoff.until { return (.skip(backoff.reason, backoff: false), now) }
            return state.lastProbe.flatMap { now - $0.at < Self.probeReuse ? ($0.outcome, $0.at) : nil }
        }) {
        case let (cached, at)?:
            outcome = cached.aged(by: now - at)
        case nil:
            outcome = await sharedProbe(replica)
        }
        switch outcome {
        case let .replica(lag, behind) where lag <= Self.seconds(maxLag):
            resumed(lag: lag)
            return Choice(pool: replica, readFrom: .init(server: .replica, replicaLagSeconds: lag, replicaBehindBytes: behind))
        case let .replica(lag, _):
            // Caught up at the probe, but the time since has taken it past the bound.
            let reason = "the replica may lag \(Self.text(lag)) s behind the primary, more than the \(Self.text(maxLag)) s allowed (ADTALLY_READ_MAX_LAG_SECONDS)"
            skipped(reason)
            return Choice(pool: primary, readFrom: .init(server: .primary, replicaSkipped: reason))
        case let .skip(reason, _):
            skipped(reason)
            return Choice(pool: primary, readFrom: .init(server: .primary, replicaSkipped: reason))
        }
    }

    /// What a probe found: the replica usable with a lag, or why not.
    enum Outcome: Sendable {
        case replica(lag: Double, behindBytes: Int64?)
        /// `backoff`: the replica is not tried again for `unreachableBackoff`.
        case skip(String, backoff: Bool)

        /// The same answer `elapsed` later: the lag grows by it (at most).
        func aged(by elapsed: Duration) -> Outcome {
            guard case let .replica(lag, behind) = self else { return self }
            return .replica(lag: lag + ReportReads.seconds(elapsed), behindBytes: behind)
        }
    }

    /// How long one probe's answer serves later reports.
    static let probeReuse: Duration = .seconds(1)
    /// How long a report waits for a probe before it reads the primary.
    static let probeDeadline: Duration = .seconds(2)

    /// Joins the probe in flight or starts one, and waits for it at most `probeDeadline`.
    private func sharedProbe(_ replica: PostgresPool) async -> Outcome {
        let task = state.withLock { state -> Task<Outcome, Never> in
            if let running = state.probe { return running }
            let started = ContinuousClock.now
            let task = Task { await self.probeOutcome(replica, started: started) }
            state.probe = task
            return task
        }
        let asked = ContinuousClock.now
        guard let answer = await Self.value(of: task, within: Self.probeDeadline) else {
            // Later reports go straight to the primary until the probe ends (it clears this).
            let reason = "the replica did not answer its lag probe within \(Self.text(Self.probeDeadline)) s"
            state.withLock { state in
                if state.probe != nil { state.backoff = (ContinuousClock.now + .seconds(3600), reason) }
            }
            return .skip(reason, backoff: false)
        }
        let started = state.withLock { $0.lastProbe?.at } ?? asked
        return answer.aged(by: ContinuousClock.now - started)
    }

    /// One probe, its outcome recorded for the next reports (and a backoff when the
    /// replica could not be reached).
    private func probeOutcome(_ replica: PostgresPool, started: ContinuousClock.Instant) async -> Outcome {
        let outcome: Outcome
        do {
            let probe = try await measure(replica)
            if let lag = probe.lagSeconds {
                lagGauge.record(lag)
                outcome = lag <= Self.seconds(maxLag)
                    ? .replica(lag: lag, behindBytes: probe.behindBytes)
                    : .skip("the replica lags \(Self.text(lag)) s behind the primary, more than the \(Self.text(maxLag)) s allowed (ADTALLY_READ_MAX_LAG_SECONDS)", backoff: false)
            } else {
                outcome = .skip(probe.problem ?? "the replica's lag is unknown", backoff: false)
            }
        } catch let error as PostgresError where error.kind == .poolTimeout {
            outcome = .skip("every connection to the replica was busy with other reports (\(Self.describe(error)))", backoff: true)
        } catch let error as PostgresError where error.isConnectionBroken || error.kind == .poolClosed {
            outcome = .skip("the replica could not be reached: \(Self.describe(error))", backoff: true)
        } catch {
            outcome = .skip("the replica's lag probe failed: \(Self.describe(error))", backoff: false)
        }
        state.withLock { state in
            state.probe = nil
            state.lastProbe = (started, outcome)
            state.backoff = nil
            if case let .skip(reason, true) = outcome {
                state.backoff = (ContinuousClock.now + Self.unreachableBackoff, reason + " (the replica is tried again \(Self.text(Self.unreachableBackoff)) s later)")
            }
        }
        return outcome
    }

    /// A task's value, or nil when it takes longer than `deadline` (the task goes on).
    static func value(of task: Task<Outcome, Never>, within deadline: Duration) async -> Outcome? {
        await withCheckedContinuation { (continuation: CheckedContinuation<Outcome?, Never>) in
            let once = ResumeOnce(continuation)
            Task { once.resume(await task.value) }
            Task {
                try? await Task.sleep(for: deadline)
                once.resume(nil)
            }
        }
    }

    /// Resumes a continuation with the first value given, once.
    final class ResumeOnce: Sendable {
        private let continuation: Mutex<CheckedContinuation<Outcome?, Never>?>
        init(_ continuation: CheckedContinuation<Outcome?, Never>) { self.continuation = Mutex(continuation) }
        func resume(_ value: Outcome?) {
            continuation.withLock { pending in
                pending?.resume(returning: value)
                pending = nil
            }
        }
    }

    /// Runs `body` on the chosen server; when the replica fails it (a recovery
    /// conflict cancelled the query, the connection went away) before `body` said it
    /// had started answering, it runs again on the primary.
    public func run<T: Sendable>(_ body: (PostgresPool, ReportNotes.ReadFrom, _ started: @escaping @Sendable () -> Void) async throws -> T) async throws -> T {
        reportsStarted.add(1, ordering: .relaxed)
        let choice = await choose()
        guard choice.isReplica else {
            primaryReads.increment()
            return try await body(choice.pool, choice.readFrom, {})
        }
        let started = Atomic<Bool>(false)
        do {
            let value = try await body(choice.pool, choice.readFrom, { started.store(true, ordering: .relaxed) })
            replicaReads.increment()
            return value
        } catch let error as ReportCurrencyError where !started.load(ordering: .relaxed) {
            // An FX rate imported a moment ago may not have reached the replica: only the
            // primary may say it is missing.
            primaryReads.increment()
            return try await body(primary, .init(server: .primary, replicaSkipped: "the replica has no FX rate for \(error.date); the primary was asked"), {})
        } catch let error as PostgresError where Self.replicaMayFail(error) && !started.load(ordering: .relaxed) {
            let reason = "the replica failed the report: \(Self.describe(error))"
            if error.isConnectionBroken || error.kind == .poolTimeout || error.kind == .poolClosed {
                state.withLock { $0.backoff = (ContinuousClock.now + Self.unreachableBackoff, reason) }
            }
            skipped(reason)
            primaryReads.increment()
            return try await body(primary, .init(server: .primary, replicaSkipped: reason), {})
        }
    }

    /// Errors after which the same report may well succeed on the primary: the
    /// replica unreachable or restarting, or a query cancelled by a conflict with
    /// recovery (SQLSTATE class 40 on a standby).
    static func replicaMayFail(_ error: PostgresError) -> Bool {
        switch error.kind {
        case .connectionFailed, .connectionLost, .poolTimeout, .poolClosed: return true
        case .server, .copy, .invalidParameter, .decoding: break
        }
        guard let state = error.sqlState?.rawValue else { return false }
        // 42P01 / 42703: a replica still replaying the migration that made a table or
        // column the report reads (a server just upgraded; the primary has it).
        return state.hasPrefix("40") || state.hasPrefix("08") || ["57P01", "57P02", "57P03", "57P04", "42P01", "42703"].contains(state)
    }

    struct Probe {
        var lagSeconds: Double?
        var behindBytes: Int64?
        var problem: String?
    }

    /// The replica's replay lag against the primary's WAL insert position (not the
    /// flush position: with `synchronous_commit = off` a commit is visible before its
    /// record is flushed), and the age of its last replayed commit by the primary's
    /// clock (the commit timestamps are the primary's; the replica's clock may differ).
    func measure(_ replica: PostgresPool) async throws -> Probe {
        // The primary may be down while the replica still answers: then the lag is the
        // age of the last replayed transaction by the replica's clock.
        let primaryRow = try? await primaryProbe.query("SELECT pg_current_wal_insert_lsn()::text, clock_timestamp()::text").first
        let position: String? = primaryRow.flatMap { try? $0.decode(0, as: String.self) }
        let primaryNow: String? = primaryRow.flatMap { try? $0.decode(1, as: String.self) }
        let row = try await replica.query("""
            SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= \(position)::pg_lsn,
                   pg_wal_lsn_diff(\(position)::pg_lsn, pg_last_wal_replay_lsn())::bigint,
                   extract(epoch FROM coalesce(\(primaryNow)::timestamptz, clock_timestamp()) - pg_last_xact_replay_timestamp())::float8
            """).first!
        guard try row.decode(0, as: Bool.self) else {
            return Probe(problem: "the replica is not a standby (pg_is_in_recovery() is false: promoted, or DATABASE_READ_URL names another primary)")
        }
        let behind = try row.decode(2, as: Int64?.self).map { max(0, $0) }
        if try row.decode(1, as: Bool?.self) == true { return Probe(lagSeconds: 0, behindBytes: 0) }
        guard let age = try row.decode(3, as: Double?.self) else {
            return Probe(behindBytes: behind, problem: "the replica has not replayed a transaction since it started")
        }
        return Probe(lagSeconds: max(0, age), behindBytes: behind)
    }

    private func skipped(_ reason: String) {
        let now = ContinuousClock.now
        let log = state.withLock { state -> Bool in
            defer { state.skipping = true }
            guard state.skipping, let last = state.lastSkipLog, now - last < Self.skipLogInterval else {
                state.lastSkipLog = now
                return true
            }
            return false
        }
        if log { logger.warning("reports read from the primary: \(reason)") }
    }

    private func resumed(lag: Double) {
        let was = state.withLock { state -> Bool in
            defer { state.skipping = false }
            return state.skipping
        }
        if was { logger.notice("reports read from the replica again", metadata: ["replay_lag_seconds": "\(Self.text(lag))"]) }
    }

    static func text(_ value: Double) -> String { String(format: "%.3f", value) }
    static func text(_ value: Duration) -> String { text(seconds(value)) }
    static func seconds(_ value: Duration) -> Double {
        Double(value.components.seconds) + Double(value.components.attoseconds) / 1e18
    }

    static func describe(_ error: any Error) -> String {
        (error as? PostgresError)?.message ?? "\(error)"
    }
}

import AdTallyCore
import Foundation
import Logging
import PostgresKit

/// A network account whose report AdTally pulls from the network's reporting API
/// (DESIGN §11, Migrations/0017). Its credential is never part of it: it is stored
/// encrypted and read only by the runner that sends it to the endpoint.
public struct NetworkPull: Sendable, Equatable, Encodable {
    /// `[a-z0-9][a-z0-9_-]{0,63}`.
    public var name: String
    /// admob, max or levelplay (the generic CSV has no API).
    public var source: NetworkReportSource
    /// The reporting API's URL (AdMob's `…/networkReport:generate`, MAX's `…/maxReport`,
    /// LevelPlay's stats URL).
    public var endpoint: String
    /// Each day's pull asks for yesterday and this many days before it.
    public var restatementDays: Int
    public var isPaused = false

    public init(name: String, source: NetworkReportSource, endpoint: String, restatementDays: Int = 3, isPaused: Bool = false) {
        self.name = name
        self.source = source
        self.endpoint = endpoint
        self.restatementDays = restatementDays
        self.isPaused = isPaused
    }

    enum CodingKeys: String, CodingKey {
        case name, source, endpoint
        case restatementDays = "restatement_days"
        case isPaused = "paused"
    }

    /// The sources that have an API.
    public static let sources: [NetworkReportSource] = [.admob, .max, .levelplay]

    /// Checks the fields an admin gives (a 400 naming the field otherwise).
    public func validate() throws(FieldError) {
        guard FieldError.isName(name) else { throw FieldError("name", FieldError.nameRule) }
        guard Self.sources.contains(source) else { throw FieldError("source", "must be admob, max or levelplay (a generic CSV has no API to pull from)") }
        try FieldError.checkURL(endpoint, field: "endpoint")
        guard (0...30).contains(restatementDays) else { throw FieldError("restatement_days", "must be a whole number of days from 0 to 30") }
    }
}

/// One pull run: a day's (or a hand-started) pull, as `network_pull_runs` keeps it.
public struct NetworkPullRun: Sendable, Equatable, Encodable {
    public var pull: String
    /// The UTC day it ran for; it asks for `firstDay` … `lastDay`.
    public var day: String
    public var status: String
    public var trigger: String
    public var attempts: Int
    public var firstDay: String?
    public var lastDay: String?
    public var importID: Int64?
    public var lines: Int?
    public var error: String?
    public var finishedAt: Date?

    enum CodingKeys: String, CodingKey {
        case pull, day, status, trigger, attempts, lines, error
        case firstDay = "first_day", lastDay = "last_day", importID = "import_id", finishedAt = "finished_at"
    }
}

/// What a pull asks its network's API for.
public struct NetworkPullRequest: Sendable {
    public var source: NetworkReportSource
    public var endpoint: String
    /// The decrypted credential: an API key (MAX) or a bearer token (AdMob, LevelPlay).
    public var credential: String
    /// First and last day, `YYYY-MM-DD`.
    public var from: String
    public var to: String

    public init(source: NetworkReportSource, endpoint: String, credential: String, from: String, to: String) {
        self.source = source
        self.endpoint = endpoint
        self.credential = credential
        self.from = from
        self.to = to
    }
}

/// Pulls: the accounts (`network_pulls`) and their runs, run by the export runner's
/// leader with the exports' retries (`ExportRunner.Configuration.pulls`).
public struct NetworkPulls: Sendable {
    /// Sends a request to a network's API and returns the body (at most
    /// `NetworkReport.maxBytes` bytes: more is an error), or throws naming what failed.
    public typealias Fetch = @Sendable (NetworkPullRequest) async throws -> [UInt8]

    let pool: PostgresPool
    /// The key credentials are encrypted with: given (ADTALLY_CREDENTIALS_KEY), else the servers' shared one.
    let key: String?
    let fetch: Fetch?

    /// Pulls over a database; `fetch` is needed only to run them.
    public init(pool: PostgresPool, key: String? = nil, fetch: Fetch? = nil) {
        self.pool = pool
        self.key = key?.isEmpty == false ? key : nil
        self.fetch = fetch
    }

    func encryptionKey() async throws -> String {
        try await AppStore(pool: pool).credentialsKey(key)
    }

    static let columns = "name, source, endpoint, restatement_days, paused"

    static func pull(_ row: PostgresRow) throws -> NetworkPull {
        var pull = NetworkPull(
            name: try row.decode(0), source: NetworkReportSource(rawValue: try row.decode(1)) ?? .admob, endpoint: try row.decode(2), restatementDays: try row.decode(3)
        )
        pull.isPaused = try row.decode(4)
        return pull
    }

    /// Creates or replaces a pull; the credential (1 to 4,096 bytes) is stored encrypted.
    /// A pull saved with `isPaused` is created (or left) paused, so it never runs before
    /// a pause could reach it; without, a pull keeps the state it had (a new one is active).
    public func save(_ pull: NetworkPull, credential: String) async throws -> NetworkPull {
        try pull.validate()
        guard (1...4096).contains(credential.utf8.count), !credential.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) else {
            throw FieldError("credential", "must be 1 to 4,096 bytes without control characters")
        }
        let key = try await encryptionKey()
        let row = try await pool.query("""
            INSERT INTO network_pulls (name, source, endpoint, credential, restatement_days, paused)
            VALUES (\(pull.name), \(pull.source.rawValue), \(pull.endpoint), pgp_sym_encrypt(\(credential), \(key)), \(pull.restatementDays), \(pull.isPaused))
            ON CONFLICT (name) DO UPDATE SET source = excluded.source, endpoint = excluded.endpoint, credential = excluded.credential,
                restatement_days = excluded.restatement_days, paused = network_pulls.paused OR excluded.paused, updated_at = now()
            RETURNING \(unsafeRaw: Self.columns)
            """).first!
        return try Self.pull(row)
    }

    /// Every pull, by name.
    public func list() async throws -> [NetworkPull] {
        try await pool.query("SELECT \(unsafeRaw: Self.columns) FROM network_pulls ORDER BY name").map(Self.pull)
    }

    /// Deletes a pull and its runs (its imports stay); false when there was none.
    public func delete(_ name: String) async throws -> Bool {
        try await !pool.query("DELETE FROM network_pulls WHERE name = \(name) RETURNING name").isEmpty
    }

    /// Pauses or resumes a pull; false when there is none.
    public func setPaused(_ name: String, _ paused: Bool) async throws -> Bool {
        try await !pool.query("UPDATE network_pulls SET paused = \(paused), updated_at = now() WHERE name = \(name) RETURNING name").isEmpty
    }

    /// A pull that is paused runs nothing, a run asked for by hand included.
    public struct Paused: Error, CustomStringConvertible {
        public var name: String
        public var description: String { "pull \(name) is paused; resume it first (adtally networks pulls resume \(name))" }
    }

    /// Asks for a run now (today's, started again if it ended; the running one if it
    /// runs); nil when there is no such pull; `Paused` when it is paused.
    public func requestRun(_ name: String, now: Date = Date()) async throws -> NetworkPullRun? {
        let day = ReportQuery.formatDate(Int((now.timeIntervalSince1970 / 86_400).rounded(.down)))
        guard let paused = try await pool.query("SELECT paused FROM network_pulls WHERE name = \(name)").first?.decode(0, as: Bool.self) else { return nil }
        if paused { throw Paused(name: name) }
        let rows = try await pool.query("""
            INSERT INTO network_pull_runs (pull, day, status, trigger, next_attempt_at)
            SELECT name, \(day)::date, 'pending', 'manual', now() FROM network_pulls WHERE name = \(name)
            ON CONFLICT (pull, day) DO UPDATE SET status = 'pending', trigger = 'manual', attempts = 0, next_attempt_at = now(), error = NULL
                WHERE network_pull_runs.status <> 'running'
            RETURNING \(unsafeRaw: Self.runColumns)
            """)
        if let row = rows.first { return try Self.run(row) }
        // Running now: that run is the answer.
        return try await pool.query("SELECT \(unsafeRaw: Self.runColumns) FROM network_pull_runs WHERE pull = \(name) AND day = \(day)::date").first.map(Self.run)
    }

    static let runColumns = "pull, day::text, status, trigger, attempts, first_day::text, last_day::text, import_id, lines, error, finished_at"

    static func run(_ row: PostgresRow) throws -> NetworkPullRun {
        NetworkPullRun(
            pull: try row.decode(0), day: try row.decode(1), status: try row.decode(2), trigger: try row.decode(3), attempts: try row.decode(4),
            firstDay: try row.decode(5), lastDay: try row.decode(6), importID: try row.decode(7), lines: try row.decode(8), error: try row.decode(9),
            finishedAt: try row.decode(10)
        )
    }

    /// A pull's runs (or every pull's), newest day first.
    public func runs(_ name: String? = nil, limit: Int = 100) async throws -> [NetworkPullRun] {
        try await pool.query("""
            SELECT \(unsafeRaw: Self.runColumns) FROM network_pull_runs WHERE \(name)::text IS NULL OR pull = \(name)
            ORDER BY day DESC, pull LIMIT \(min(max(limit, 1), 10_000))
            """).map(Self.run)
    }

    // MARK: - The runner's part (ExportRunner's leader, on its connection)

    /// Marks runs left running by a runner that is gone for retry (or failed, past the
    /// attempts): called by a leader as it takes over, as export runs are.
    static func recover(_ connection: PostgresConnection, maxAttempts: Int) throws {
        _ = try connection.query("""
            UPDATE network_pull_runs SET status = CASE WHEN attempts >= \(maxAttempts) THEN 'failed' ELSE 'retrying' END,
                   next_attempt_at = now(), finished_at = now(), error = 'the runner (' || coalesce(runner, '?') || ') stopped during this attempt'
            WHERE status = 'running'
            """)
    }

    /// Plans today's run (UTC) of every pull not paused.
    static func plan(_ connection: PostgresConnection, now: Date) throws {
        let day = ReportQuery.formatDate(Int((now.timeIntervalSince1970 / 86_400).rounded(.down)))
        _ = try connection.query("""
            INSERT INTO network_pull_runs (pull, day, status, trigger, next_attempt_at)
            SELECT name, \(day)::date, 'pending', 'schedule', \(now) FROM network_pulls WHERE NOT paused
            ON CONFLICT (pull, day) DO NOTHING
            """)
    }

    struct Claim: Sendable {
        var pull: NetworkPull
        var day: Int
        var attempt: Int
    }

    /// Claims the next due run of a pull not paused.
    static func claim(_ connection: PostgresConnection, now: Date, runner: String) throws -> Claim? {
        let rows = try connection.query("""
            WITH next AS (
                SELECT r.pull, r.day FROM network_pull_runs r JOIN network_pulls p ON p.name = r.pull AND NOT p.paused
                WHERE r.status IN ('pending', 'retrying') AND r.next_attempt_at <= \(now)
                ORDER BY r.next_attempt_at, r.pull LIMIT 1 FOR UPDATE OF r SKIP LOCKED
            )
            UPDATE network_pull_runs r SET status = 'running', attempts = attempts + 1, runner = \(runner), started_at = now(), finished_at = NULL
            FROM next WHERE (r.pull, r.day) = (next.pull, next.day)
            RETURNING r.pull, r.day - DATE '1970-01-01', r.attempts
            """)
        guard let row = rows.first else { return nil }
        let name = try row.decode(0, as: String.self)
        guard let pull = try connection.query("SELECT \(unsafeRaw: columns) FROM network_pulls WHERE name = \(name)").first else { return nil }
        return Claim(pull: try Self.pull(pull), day: try row.decode(1), attempt: try row.decode(2))
    }

    /// Runs one claimed pull: asks the API for yesterday and the restatement window,
    /// imports the answer as every import is (all or none, `via` pull), and records the
    /// outcome; a failure is retried as an export is (`backoff`), then `failed`.
    func execute(_ claim: Claim, lease: PostgresLease, runner: String, maxAttempts: Int, backoff: @Sendable (Int) -> Duration, logger: Logger) async throws {
        let started = ContinuousClock.now
        let name = claim.pull.name
        let (from, to) = (ReportQuery.formatDate(claim.day - 1 - claim.pull.restatementDays), ReportQuery.formatDate(claim.day - 1))
        let dayText = ReportQuery.formatDate(claim.day)
        do {
            guard let fetch else { throw FieldError("endpoint", "this server has no HTTP client to pull with") }
            let key = try await encryptionKey()
            let credential = try await lease.run { connection in
                try connection.query("SELECT pgp_sym_decrypt(credential, \(key)) FROM network_pulls WHERE name = \(name)").first?.decode(0, as: String.self)
            }
            guard let credential else { throw FieldError("credential", "the pull was deleted") }
            let body = try await fetch(NetworkPullRequest(source: claim.pull.source, endpoint: claim.pull.endpoint, credential: credential, from: from, to: to))
            let report = try NetworkReport.parse(body, source: claim.pull.source, fromAPI: true)
            let result = try await NetworkReportStore(pool: pool).importReport(report, fileSHA256: SHA256.hex(body), via: "pull")
            let durationMs = Int64((ContinuousClock.now - started).components.seconds * 1000)
            try await lease.run { connection in
                _ = try connection.query("""
                    UPDATE network_pull_runs SET status = 'succeeded', finished_at = now(), duration_ms = \(durationMs), first_day = \(from)::date, last_day = \(to)::date,
                           import_id = \(result.importID), lines = \(result.lines), error = NULL
                    WHERE pull = \(name) AND day = \(dayText)::date AND runner = \(runner) AND status = 'running'
                    """)
            }
            logger.info("network report pulled", metadata: [
                "pull": "\(name)", "from": "\(from)", "to": "\(to)", "import": "\(result.importID)", "lines": "\(result.lines)", "replaced": "\(result.replaced)",
                "warnings": "\(result.warnings.joined(separator: ","))",
            ])
        } catch {
            let interrupted = Task.isCancelled
            let message = interrupted ? "interrupted: the server was shutting down" : "\(error)"
            let gaveUp = !interrupted && claim.attempt >= maxAttempts
            let retry = interrupted ? Duration.zero : backoff(claim.attempt)
            logger.error("network report pull failed", metadata: ["pull": "\(name)", "attempt": "\(claim.attempt)", "error": "\(message)"])
            try await lease.run { connection in
                _ = try connection.query("""
                    UPDATE network_pull_runs SET status = \(gaveUp ? "failed" : "retrying"), finished_at = now(), first_day = \(from)::date, last_day = \(to)::date,
                           next_attempt_at = now() + make_interval(secs => \(Double(retry.components.seconds) + Double(retry.components.attoseconds) / 1e18)),
                           error = \(String(message.prefix(2000)))
                    WHERE pull = \(name) AND day = \(dayText)::date AND runner = \(runner) AND status = 'running'
                    """)
            }
            if interrupted { throw CancellationError() }
        }
    }
}

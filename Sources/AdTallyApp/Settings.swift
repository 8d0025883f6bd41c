import AdTallyCore
import AdTallyHTTP
import Foundation
import Logging
import PostgresKit

/// Everything configurable about AdTally, resolved flag → environment → default.
public struct Settings: Sendable {
    /// PostgreSQL URL or conninfo; nil runs the embedded cluster.
    public var databaseURL: String?
    /// PostgreSQL URL or conninfo of a streaming replica that reports read from; nil: the primary.
    public var databaseReadURL: String?
    /// The most replay lag (seconds) a report may read the replica with; beyond it, the primary.
    public var readMaxLagSeconds: Int = 30
    /// Folder of the embedded cluster.
    public var dataDirectory: String
    /// Also listen on this TCP port (127.0.0.1) in the embedded cluster; nil: unix socket only.
    public var embeddedTCPPort: Int?
    /// Folder of `NNNN_name.sql` migrations; nil: the default lookup.
    public var migrationsDirectory: String?
    /// HTTP bind host.
    public var host: String
    /// HTTP bind port.
    public var port: Int
    /// Most PostgreSQL connections per process.
    public var poolSize: Int
    /// Log level.
    public var logLevel: Logger.Level
    /// Days of raw events kept (rollups are kept).
    public var retentionDays: Int
    /// Most events in one ingest request.
    public var maxEventsPerRequest: Int
    /// Most bytes in one ingest request body, before and after decompression.
    public var maxBodyBytes: Int
    /// Ingest transactions in flight at once (group commit writers).
    public var ingestFlushers: Int
    /// How old an event's `occurred_at` may be (days).
    public var maxEventAgeDays: Int
    /// How far ahead of server time an event's `occurred_at` may be (minutes).
    public var maxEventAheadMinutes: Int
    /// Seconds an HTTP connection may go without a complete request head, a body
    /// chunk, or (kept alive) a new request before it is closed.
    public var httpIdleTimeoutSeconds: Int
    /// Seconds an ingest request body may take to arrive in full.
    public var httpBodyTimeoutSeconds: Int
    /// Most HTTP connections open at once; more wait in the kernel's accept queue.
    public var maxConnections: Int
    /// Seconds a graceful shutdown waits for requests in progress before cancelling them.
    public var shutdownTimeoutSeconds: Int
    /// PostgreSQL `statement_timeout` of every connection, in seconds (0: none).
    public var dbStatementTimeoutSeconds: Int
    /// libpq `connect_timeout`, in seconds.
    public var dbConnectTimeoutSeconds: Int
    /// How far back (days) `serve` still writes export slots missed while no server ran.
    public var exportCatchUpDays: Int = 7
    /// Seconds after which a mediation decision is computed again (`--mediation-refresh`).
    public var mediationRefreshSeconds: Int = 60
    /// The folder every export destination must lie in (`--exports-root`; default the
    /// data directory's `exports`): the exports API takes folders from the network, and
    /// must not write wherever the server's user can.
    public var exportsRoot: String = ""
    /// The key the networks' API credentials are encrypted with (`ADTALLY_CREDENTIALS_KEY`;
    /// from the environment only, never a flag a process list shows). Without it, a key kept
    /// in the database (server_secrets) is used, and a dump of the database holds both.
    public var credentialsKey: String?
    /// About how long one statement of an erasure job that deletes raw events takes
    /// (`ADTALLY_ERASURE_STATEMENT_MS`): each range of time is sized to it.
    public var erasureStatementMilliseconds = 250
    /// Where AdTally's own requests (alert webhooks, network pulls) may go besides the
    /// public internet (`ADTALLY_OUTBOUND_ALLOW`: CIDRs, addresses or host names, comma
    /// separated); loopback, link-local, private and reserved ranges are refused otherwise.
    public var outboundAllow = OutboundPolicy.defaultPolicy
    /// How long a CSV report stream may hold its snapshot, and the least its reader must
    /// take (`ADTALLY_REPORT_STREAM_MAX_SECONDS`, `…_MIN_BYTES_PER_SECOND` over each
    /// `…_RATE_WINDOW_SECONDS`): past either, the stream is cut.
    public var reportStreamLimits = ReportStreamLimits()
    /// Where users reach this service (`ADTALLY_PUBLIC_URL`, e.g. `https://adtally.example.com`;
    /// default `http://HOST:PORT`): the dashboard links in alert notifications start with it.
    public var publicURL: String = ""
    /// A folder whose files are served as they are under `/static/` (`--static-dir`): a
    /// hand-written switch file, say, served beside the computed one.
    public var staticDirectory: String?

    /// The accepted age of `occurred_at`.
    public var maxEventAge: Duration { .seconds(maxEventAgeDays * 86_400) }
    /// The accepted lead of `occurred_at` over server time.
    public var maxEventAhead: Duration { .seconds(maxEventAheadMinutes * 60) }

    /// Defaults, before flags and environment.
    public static let defaults = Settings(
        databaseURL: nil, dataDirectory: ".adtally", embeddedTCPPort: nil, migrationsDirectory: nil,
        host: "127.0.0.1", port: 8080, poolSize: 8, logLevel: .info,
        retentionDays: 90, maxEventsPerRequest: 1000, maxBodyBytes: 1 << 20, ingestFlushers: 4,
        maxEventAgeDays: 7, maxEventAheadMinutes: 60,
        httpIdleTimeoutSeconds: 60, httpBodyTimeoutSeconds: 60, maxConnections: 1024, shutdownTimeoutSeconds: 15,
        dbStatementTimeoutSeconds: 60, dbConnectTimeoutSeconds: 10
    )

    /// Connect, TCP keepalive and statement timeouts for every PostgreSQL connection.
    public var databaseOptions: PostgresConnection.Options {
        PostgresConnection.Options(
            connectTimeout: .seconds(dbConnectTimeoutSeconds),
            statementTimeout: dbStatementTimeoutSeconds == 0 ? nil : .seconds(dbStatementTimeoutSeconds)
        )
    }

    /// The flags a command was given; nil means "not given".
    public struct Flags: Sendable {
        /// `--database-url`, when given.
        public var databaseURL: String?
        /// `--database-read-url`, when given.
        public var databaseReadURL: String?
        /// `--read-max-lag`, when given.
        public var readMaxLagSeconds: Int?
        /// `--data-dir`, when given.
        public var dataDirectory: String?
        /// `--embedded-tcp-port`, when given.
        public var embeddedTCPPort: Int?
        /// `--migrations-dir`, when given.
        public var migrationsDirectory: String?
        /// `--host`, when given.
        public var host: String?
        /// `--port`, when given.
        public var port: Int?
        /// `--pool-size`, when given.
        public var poolSize: Int?
        /// `--log-level`, when given.
        public var logLevel: String?
        /// `--retention-days`, when given.
        public var retentionDays: Int?
        /// `--max-events`, when given.
        public var maxEventsPerRequest: Int?
        /// `--max-body-bytes`, when given.
        public var maxBodyBytes: Int?
        /// `--ingest-flushers`, when given.
        public var ingestFlushers: Int?
        /// `--max-event-age-days`, when given.
        public var maxEventAgeDays: Int?
        /// `--max-event-ahead-minutes`, when given.
        public var maxEventAheadMinutes: Int?
        /// `--idle-timeout`, when given.
        public var httpIdleTimeoutSeconds: Int?
        /// `--body-timeout`, when given.
        public var httpBodyTimeoutSeconds: Int?
        /// `--max-connections`, when given.
        public var maxConnections: Int?
        /// `--shutdown-timeout`, when given.
        public var shutdownTimeoutSeconds: Int?
        /// `--statement-timeout`, when given.
        public var dbStatementTimeoutSeconds: Int?
        /// `--connect-timeout`, when given.
        public var dbConnectTimeoutSeconds: Int?
        /// `--export-catch-up-days` / `ADTALLY_EXPORT_CATCH_UP_DAYS`.
        public var exportCatchUpDays: Int?
        public var reportStreamMaxSeconds: Int?
        public var reportStreamMinBytesPerSecond: Int?
        public var reportStreamWindowSeconds: Int?
        /// `--mediation-refresh` / `ADTALLY_MEDIATION_REFRESH_SECONDS`.
        public var mediationRefreshSeconds: Int?
        /// `--static-dir` / `ADTALLY_STATIC_DIR`.
        public var staticDirectory: String?
        /// `--exports-root` / `ADTALLY_EXPORTS_ROOT`.
        public var exportsRoot: String?

        /// Flags as given; nil means not given.
        public init(
            databaseURL: String? = nil, dataDirectory: String? = nil, embeddedTCPPort: Int? = nil,
            migrationsDirectory: String? = nil, host: String? = nil, port: Int? = nil, poolSize: Int? = nil,
            logLevel: String? = nil, retentionDays: Int? = nil, maxEventsPerRequest: Int? = nil, maxBodyBytes: Int? = nil,
            ingestFlushers: Int? = nil, maxEventAgeDays: Int? = nil, maxEventAheadMinutes: Int? = nil,
            httpIdleTimeoutSeconds: Int? = nil, httpBodyTimeoutSeconds: Int? = nil, maxConnections: Int? = nil,
            shutdownTimeoutSeconds: Int? = nil, dbStatementTimeoutSeconds: Int? = nil, dbConnectTimeoutSeconds: Int? = nil
        ) {
            self.databaseURL = databaseURL
            self.dataDirectory = dataDirectory
            self.embeddedTCPPort = embeddedTCPPort
            self.migrationsDirectory = migrationsDirectory
            self.host = host
            self.port = port
            self.poolSize = poolSize
            self.logLevel = logLevel
            self.retentionDays = retentionDays
            self.maxEventsPerRequest = maxEventsPerRequest
            self.maxBodyBytes = maxBodyBytes
            self.ingestFlushers = ingestFlushers
            self.maxEventAgeDays = maxEventAgeDays
            self.maxEventAheadMinutes = maxEventAheadMinutes
            self.httpIdleTimeoutSeconds = httpIdleTimeoutSeconds
            self.httpBodyTimeoutSeconds = httpBodyTimeoutSeconds
            self.maxConnections = maxConnections
            self.shutdownTimeoutSeconds = shutdownTimeoutSeconds
            self.dbStatementTimeoutSeconds = dbStatementTimeoutSeconds
            self.dbConnectTimeoutSeconds = dbConnectTimeoutSeconds
        }
    }

    /// Resolves settings: each flag wins over its environment variable, which wins over the default.
    public static func resolve(flags: Flags, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> Settings {
        func text(_ flag: String?, _ variable: String) -> String? {
            if let flag, !flag.isEmpty { return flag }
            if let value = environment[variable], !value.isEmpty { return value }
            return nil
        }
        func number(_ flag: Int?, _ variable: String, range: ClosedRange<Int>) throws -> Int? {
            if let flag {
                guard range.contains(flag) else { throw SettingsError.outOfRange(variable, "\(flag)", range) }
                return flag
            }
            guard let raw = environment[variable], !raw.isEmpty else { return nil }
            guard let value = Int(raw), range.contains(value) else { throw SettingsError.outOfRange(variable, raw, range) }
            return value
        }
        var settings = defaults
        settings.databaseURL = text(flags.databaseURL, "DATABASE_URL")
        settings.databaseReadURL = text(flags.databaseReadURL, "DATABASE_READ_URL")
        settings.readMaxLagSeconds = try number(flags.readMaxLagSeconds, "ADTALLY_READ_MAX_LAG_SECONDS", range: 0...86_400) ?? defaults.readMaxLagSeconds
        settings.dataDirectory = text(flags.dataDirectory, "ADTALLY_DATA_DIR") ?? defaults.dataDirectory
        settings.embeddedTCPPort = try number(flags.embeddedTCPPort, "ADTALLY_EMBEDDED_TCP_PORT", range: 1...65535)
        settings.migrationsDirectory = text(flags.migrationsDirectory, "ADTALLY_MIGRATIONS_DIR")
        settings.host = text(flags.host, "ADTALLY_HOST") ?? defaults.host
        settings.port = try number(flags.port, "ADTALLY_PORT", range: 0...65535) ?? defaults.port
        settings.poolSize = try number(flags.poolSize, "ADTALLY_POOL_SIZE", range: 2...256) ?? defaults.poolSize
        settings.retentionDays = try number(flags.retentionDays, "ADTALLY_RETENTION_DAYS", range: 9...36_500) ?? defaults.retentionDays
        settings.maxEventsPerRequest = try number(flags.maxEventsPerRequest, "ADTALLY_MAX_EVENTS", range: 1...1_000_000)
            ?? defaults.maxEventsPerRequest
        settings.maxBodyBytes = try number(flags.maxBodyBytes, "ADTALLY_MAX_BODY_BYTES", range: 1024...1 << 30) ?? defaults.maxBodyBytes
        settings.ingestFlushers = try number(flags.ingestFlushers, "ADTALLY_INGEST_FLUSHERS", range: 1...64) ?? defaults.ingestFlushers
        settings.maxEventAgeDays = try number(flags.maxEventAgeDays, "ADTALLY_MAX_EVENT_AGE_DAYS", range: 1...36_499) ?? defaults.maxEventAgeDays
        settings.maxEventAheadMinutes = try number(flags.maxEventAheadMinutes, "ADTALLY_MAX_EVENT_AHEAD_MINUTES", range: 0...10_080)
            ?? defaults.maxEventAheadMinutes
        settings.httpIdleTimeoutSeconds = try number(flags.httpIdleTimeoutSeconds, "ADTALLY_IDLE_TIMEOUT_SECONDS", range: 1...3600)
            ?? defaults.httpIdleTimeoutSeconds
        settings.httpBodyTimeoutSeconds = try number(flags.httpBodyTimeoutSeconds, "ADTALLY_BODY_TIMEOUT_SECONDS", range: 1...3600)
            ?? defaults.httpBodyTimeoutSeconds
        settings.maxConnections = try number(flags.maxConnections, "ADTALLY_MAX_CONNECTIONS", range: 1...1_000_000) ?? defaults.maxConnections
        settings.shutdownTimeoutSeconds = try number(flags.shutdownTimeoutSeconds, "ADTALLY_SHUTDOWN_TIMEOUT_SECONDS", range: 1...3600)
            ?? defaults.shutdownTimeoutSeconds
        settings.dbStatementTimeoutSeconds = try number(flags.dbStatementTimeoutSeconds, "ADTALLY_STATEMENT_TIMEOUT_SECONDS", range: 0...86_400)
            ?? defaults.dbStatementTimeoutSeconds
        settings.dbConnectTimeoutSeconds = try number(flags.dbConnectTimeoutSeconds, "ADTALLY_CONNECT_TIMEOUT_SECONDS", range: 2...3600)
            ?? defaults.dbConnectTimeoutSeconds
        settings.reportStreamLimits = ReportStreamLimits(
            maxLifetime: .seconds(try number(flags.reportStreamMaxSeconds, "ADTALLY_REPORT_STREAM_MAX_SECONDS", range: 1...86_400) ?? 1800),
            minBytesPerSecond: try number(flags.reportStreamMinBytesPerSecond, "ADTALLY_REPORT_STREAM_MIN_BYTES_PER_SECOND", range: 0...1 << 30) ?? 4096,
            window: .seconds(try number(flags.reportStreamWindowSeconds, "ADTALLY_REPORT_STREAM_RATE_WINDOW_SECONDS", range: 1...3600) ?? 30)
        )
        settings.exportCatchUpDays = try number(flags.exportCatchUpDays, "ADTALLY_EXPORT_CATCH_UP_DAYS", range: 1...366) ?? defaults.exportCatchUpDays
        settings.mediationRefreshSeconds = try number(flags.mediationRefreshSeconds, "ADTALLY_MEDIATION_REFRESH_SECONDS", range: 1...3600)
            ?? defaults.mediationRefreshSeconds
        settings.exportsRoot = URL(fileURLWithPath: text(flags.exportsRoot, "ADTALLY_EXPORTS_ROOT") ?? settings.dataDirectory + "/exports")
            .standardizedFileURL.path
        settings.staticDirectory = text(flags.staticDirectory, "ADTALLY_STATIC_DIR")
        settings.credentialsKey = text(nil, "ADTALLY_CREDENTIALS_KEY")
        settings.erasureStatementMilliseconds = try number(nil, "ADTALLY_ERASURE_STATEMENT_MS", range: 1...1000) ?? settings.erasureStatementMilliseconds
        if let allow = text(nil, "ADTALLY_OUTBOUND_ALLOW") {
            do {
                settings.outboundAllow = try OutboundPolicy(allowing: allow)
            } catch {
                throw SettingsError.invalid("ADTALLY_OUTBOUND_ALLOW", allow, "a comma-separated list of CIDRs, addresses and host names (\(error.rule))")
            }
        }
        if let url = text(nil, "ADTALLY_PUBLIC_URL") {
            // The rule of every URL AdTally links or sends to, and no query (links append theirs).
            guard (try? FieldError.checkURL(url, field: "ADTALLY_PUBLIC_URL")) != nil, URL(string: url)?.query == nil
            else { throw SettingsError.invalid("ADTALLY_PUBLIC_URL", url, "an http or https URL with a host, without a query, fragment or credentials") }
            settings.publicURL = url.hasSuffix("/") ? String(url.dropLast()) : url
        } else {
            let host = ["0.0.0.0", "::", ""].contains(settings.host) ? "localhost" : settings.host.contains(":") ? "[\(settings.host)]" : settings.host
            settings.publicURL = "http://\(host):\(settings.port)"
        }
        if let folder = settings.staticDirectory {
            var isFolder: ObjCBool = false
            guard FileManager.default.fileExists(atPath: folder, isDirectory: &isFolder), isFolder.boolValue else {
                throw SettingsError.invalid("ADTALLY_STATIC_DIR", folder, "an existing folder")
            }
        }
        // Events older than the retention period would land in partitions about to be dropped.
        guard settings.maxEventAgeDays < settings.retentionDays else {
            throw SettingsError.invalid(
                "ADTALLY_MAX_EVENT_AGE_DAYS", "\(settings.maxEventAgeDays)",
                "less than the retention period (ADTALLY_RETENTION_DAYS = \(settings.retentionDays))"
            )
        }
        if let level = text(flags.logLevel, "LOG_LEVEL") {
            guard let parsed = Logger.Level(rawValue: level.lowercased()) else {
                throw SettingsError.invalid("LOG_LEVEL", level, "one of trace, debug, info, notice, warning, error, critical")
            }
            settings.logLevel = parsed
        }
        return settings
    }
}

/// A setting that could not be used.
public enum SettingsError: Error, CustomStringConvertible {
    case outOfRange(String, String, ClosedRange<Int>)
    case invalid(String, String, String)

    public var description: String {
        switch self {
        case .outOfRange(let name, let value, let range):
            "\(name) must be a whole number from \(range.lowerBound) to \(range.upperBound), got \"\(value)\""
        case .invalid(let name, let value, let rule):
            "\(name) must be \(rule), got \"\(value)\""
        }
    }
}

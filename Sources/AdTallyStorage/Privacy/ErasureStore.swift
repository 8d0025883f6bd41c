import AdTallyCore
import Foundation
import PostgresKit

/// An erasure job and its log entry (Migrations/0027): what `GET /v1/erasures/{id}` and
/// `adtally devices forget` show. It never holds an id.
public struct Erasure: Sendable, Equatable, Codable {
    /// The job.
    public var id: UUID
    /// The app whose devices it erases.
    public var app: String
    /// Where it stands.
    public var status: DeviceErasure.Status
    /// How many devices it erases.
    public var devices: Int
    /// Who asked: an admin key's id, or `kit` (the app's install itself, `forgetInstall()`).
    public var requestedBy: String
    /// When it was asked for: events of these devices that occurred before this are erased
    /// and refused from now on; later ones are new data.
    public var requestedAt: Date
    /// When it last started (nil: not yet).
    public var startedAt: Date?
    /// When it ended (done or failed).
    public var finishedAt: Date?
    /// Why it failed, or why the last attempt did.
    public var error: String?
    /// Rows removed so far, per table.
    public var rows: Rows
    /// The first and last install day (cohort) the erased devices had, nil when none had
    /// an install row: a cohort report over those days says an erasure changed it.
    public var firstCohort: String?
    /// See `firstCohort`.
    public var lastCohort: String?

    /// Rows removed per table.
    public struct Rows: Sendable, Equatable, Codable {
        public var events: Int64
        public var installs: Int64
        public var installDays: Int64
        public var installDayRevenue: Int64
        public var installDelta: Int64
        /// Its first exposures to experiments (DESIGN §14).
        public var experimentExposures: Int64 = 0

        enum CodingKeys: String, CodingKey {
            case events, installs
            case experimentExposures = "experiment_exposures"
            case installDays = "install_days"
            case installDayRevenue = "install_day_revenue"
            case installDelta = "install_delta"
        }
    }

    enum CodingKeys: String, CodingKey {
        case id, app, status, devices, error, rows
        case requestedBy = "requested_by"
        case requestedAt = "requested_at"
        case startedAt = "started_at"
        case finishedAt = "finished_at"
        case firstCohort = "first_cohort"
        case lastCohort = "last_cohort"
    }

    /// Whether it will not change any more.
    public var isFinished: Bool { status == .done || status == .failed }

    /// Every key written (nulls included), the id in lower case as `Location` gives it.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id.uuidString.lowercased(), forKey: .id)
        try container.encode(app, forKey: .app)
        try container.encode(status, forKey: .status)
        try container.encode(devices, forKey: .devices)
        try container.encode(requestedBy, forKey: .requestedBy)
        try container.encode(requestedAt, forKey: .requestedAt)
        try container.encode(startedAt, forKey: .startedAt)
        try container.encode(finishedAt, forKey: .finishedAt)
        try container.encode(error, forKey: .error)
        try container.encode(rows, forKey: .rows)
        try container.encode(firstCohort, forKey: .firstCohort)
        try container.encode(lastCohort, forKey: .lastCohort)
    }
}

/// Why an erasure was refused.
public enum ErasureError: Error, Sendable, Equatable, CustomStringConvertible {
    case invalid(FieldError)
    case unknownApp(String)
    /// The kit's own request for a device this app never sent (nothing to erase).
    case unknownDevice

    public var description: String {
        switch self {
        case .invalid(let error): error.description
        case .unknownApp(let app): "no app \"\(app)\""
        case .unknownDevice: "device: no event of this app ever named it (nothing to erase)"
        }
    }
}

/// Queues erasures and reads their log.
public struct ErasureStore: Sendable {
    let pool: PostgresPool

    /// A store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Queues the erasure of `devices` of `app` (checked by `DeviceErasure.devices`);
    /// `requestedBy`: the admin key's id, or `kit`. The job runs on whichever server runs
    /// erasures (`ErasureRunner`).
    public func queue(app: String, devices given: [String], requestedBy: String) async throws -> Erasure {
        let devices: [String]
        do {
            devices = try DeviceErasure.devices(given)
        } catch {
            throw ErasureError.invalid(error)
        }
        let id = UUID()
        return try await pool.withTransaction { connection in
            guard try !connection.query("SELECT 1 FROM apps WHERE app_id = \(app)").isEmpty else { throw ErasureError.unknownApp(app) }
            try connection.query("""
                INSERT INTO erasures (id, app, requested_by, devices) VALUES (\(id), \(app), \(requestedBy), \(devices.count))
                """)
            try connection.query("INSERT INTO erasure_devices (erasure_id, device) SELECT \(id), unnest(\(array: devices)::text[])")
            return try Self.read(id, on: connection)!
        }
    }

    /// The kit's own request (`forgetInstall()`): the app's ingest key and the install's
    /// id, a random UUID, are the capability. Only for an id the app has sent (its
    /// install row, or install deltas not yet folded): anything else is
    /// `ErasureError.unknownDevice`, so an ingest key cannot queue jobs for made-up ids.
    /// An erasure of the same device already queued or running is answered instead of a new one.
    public func queueFromKit(app: String, device: String) async throws -> Erasure {
        guard DeviceErasure.isDevice(device) else { throw ErasureError.invalid(FieldError("device", DeviceErasure.deviceRule)) }
        let seen = try await pool.query("""
            SELECT EXISTS (SELECT 1 FROM installs WHERE app_id = \(app) AND device = \(device))
                OR EXISTS (SELECT 1 FROM install_delta WHERE app_id = \(app) AND device = \(device))
            """)[0].decode(0, as: Bool.self)
        guard seen else { throw ErasureError.unknownDevice }
        if let open = try await pool.query("""
            SELECT e.id FROM erasures e JOIN erasure_devices d ON d.erasure_id = e.id
            WHERE e.app = \(app) AND d.device = \(device) AND e.status IN ('queued', 'running') LIMIT 1
            """).first, let erasure = try await get(try open.decode(0, as: UUID.self)) {
            return erasure
        }
        return try await queue(app: app, devices: [device], requestedBy: "kit")
    }

    /// One erasure.
    public func get(_ id: UUID) async throws -> Erasure? {
        try await pool.withConnection { try Self.read(id, on: $0) }
    }

    /// An app's erasures, newest first (the log).
    public func list(app: String, limit: Int = 100) async throws -> [Erasure] {
        try await pool.query("SELECT \(unsafeRaw: Self.columns) FROM erasures WHERE app = \(app) ORDER BY requested_at DESC LIMIT \(limit)")
            .map(Self.erasure)
    }

    /// The erasures done for `app` that changed cohorts between `first` and `last`
    /// (install days, `YYYY-MM-DD`): how many, and how many devices, for a report's notes.
    public static func erasedCohorts(app: String, first: String, last: String, on connection: PostgresConnection) throws -> (jobs: Int, devices: Int) {
        let row = try connection.query("""
            SELECT count(*)::bigint, coalesce(sum(devices), 0)::bigint FROM erasures
            WHERE app = \(app) AND status = 'done' AND first_cohort <= \(last)::date AND last_cohort >= \(first)::date
            """)[0]
        return (Int(try row.decode(0, as: Int64.self)), Int(try row.decode(1, as: Int64.self)))
    }

    static let columns = """
        id, app, status, devices, requested_by, requested_at, started_at, finished_at, error, events_rows, installs_rows,
        install_days_rows, install_day_revenue_rows, install_delta_rows, first_cohort::text, last_cohort::text, experiment_exposures_rows
        """

    static func read(_ id: UUID, on connection: PostgresConnection) throws -> Erasure? {
        try connection.query("SELECT \(unsafeRaw: columns) FROM erasures WHERE id = \(id)").first.map(erasure)
    }

    static func erasure(_ row: PostgresRow) throws -> Erasure {
        Erasure(
            id: try row.decode(0), app: try row.decode(1), status: DeviceErasure.Status(rawValue: try row.decode(2)) ?? .failed,
            devices: Int(try row.decode(3, as: Int32.self)), requestedBy: try row.decode(4), requestedAt: try row.decode(5),
            startedAt: try row.decode(6), finishedAt: try row.decode(7), error: try row.decode(8),
            rows: Erasure.Rows(
                events: try row.decode(9), installs: try row.decode(10), installDays: try row.decode(11),
                installDayRevenue: try row.decode(12), installDelta: try row.decode(13), experimentExposures: try row.decode(16)
            ),
            firstCohort: try row.decode(14), lastCohort: try row.decode(15)
        )
    }
}

import AdTallyCore
import Foundation
import PostgresKit

/// A device's data as NDJSON (GDPR Art. 15, DESIGN §15): what `GET
/// /v1/apps/{app}/devices/{device}` and `adtally devices show` give. One snapshot
/// (REPEATABLE READ, read only), read through a cursor a chunk at a time and handed on
/// before the next is fetched: memory stays bounded whatever the device's history.
///
/// Lines, each a JSON object with `kind`:
/// - `install`: its install row (first seen, cohort day, what it was first seen with);
/// - `day`: each local day it was active (its events, requests, impressions, taps, sessions);
/// - `day_revenue`: its impressions, taps and money per day, UTC hour, network, format, country;
/// - `pending`: sums of its newest events not yet folded into those rows;
/// - `event`: each raw event still kept, oldest first;
/// - `end`: last, with the count of lines of each kind (`lines`: a reader knows the file is whole) and the
///   app's retention (`retention_days`; raw events before that are gone for every device).
public struct DeviceAccess: Sendable {
    let pool: PostgresPool

    /// Access over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Rows per FETCH.
    static let chunk = 2000

    /// Why an access was refused before anything was sent.
    public enum Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        case invalid(FieldError)
        case unknownApp(String)
        public var description: String {
            switch self {
            case .invalid(let error): error.description
            case .unknownApp(let app): "no app \"\(app)\""
            }
        }
    }

    /// Checks the request (app and device) before a stream starts: a refusal can still be a 4xx.
    public func check(app: String, device: String) async throws {
        guard DeviceErasure.isDevice(device) else { throw Refusal.invalid(FieldError("device", DeviceErasure.deviceRule)) }
        guard try await !pool.query("SELECT 1 FROM apps WHERE app_id = \(app)").isEmpty else { throw Refusal.unknownApp(app) }
    }

    /// Streams the device's lines to `write`, a chunk (complete lines) at a time; `write`
    /// awaiting the reader is what bounds memory.
    public func stream(app: String, device: String, retentionDays: Int, write: ([UInt8]) async throws -> Void) async throws {
        try await pool.withLease { lease in
            try await lease.run { connection in
                try connection.execute(unsafeSQL: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            }
            var counts: [(String, Int)] = []
            for (kind, sql) in Self.parts(app: app, device: device) {
                try await lease.run { connection in
                    try connection.query("DECLARE device_access NO SCROLL CURSOR FOR \(sql)")
                }
                var count = 0
                while true {
                    let lines = try await lease.run { connection -> [UInt8] in
                        var out: [UInt8] = []
                        for row in try connection.execute(unsafeSQL: "FETCH \(Self.chunk) FROM device_access") {
                            out.append(contentsOf: try row.decode(0, as: String.self).utf8)
                            out.append(0x0A)
                        }
                        return out
                    }
                    if lines.isEmpty { break }
                    count += lines.lazy.filter { $0 == 0x0A }.count
                    try await write(lines)
                }
                try await lease.run { connection in try connection.execute(unsafeSQL: "CLOSE device_access") }
                counts.append((kind, count))
            }
            let retention = try await lease.run { connection -> Int in
                let days = try connection.query("SELECT least(coalesce(retention_days, \(retentionDays)), \(retentionDays)) FROM apps WHERE app_id = \(app)")
                    .first?.decode(0, as: Int.self) ?? retentionDays
                try connection.execute(unsafeSQL: "COMMIT")
                return days
            }
            var summary = #"{"kind":"end","app":"# + Self.json(app) + #","device":"# + Self.json(device)
            summary += #","lines":{"# + counts.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
            summary += #","retention_days":\#(retention)}"# + "\n"
            try await write(Array(summary.utf8))
        }
    }

    /// A JSON string literal.
    static func json(_ text: String) -> String {
        let data = (try? JSONEncoder().encode(text)) ?? Data("\"\"".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    /// Each kind of line and the query that makes its lines (one JSON text per row), in the order written.
    static func parts(app: String, device: String) -> [(String, PostgresQuery)] {
        [
            ("install", """
                SELECT json_build_object('kind', 'install', 'app', app_id, 'device', device, 'first_seen', first_seen, 'cohort', day,
                                         'country', country, 'platform', platform, 'app_version', app_version)::text
                FROM installs WHERE app_id = \(app) AND device = \(device)
                """),
            ("day", """
                SELECT json_build_object('kind', 'day', 'day', day, 'cohort', cohort, 'events', events, 'requests', requests,
                                         'impressions', impressions, 'taps', taps, 'sessions', sessions)::text
                FROM install_days WHERE app_id = \(app) AND device = \(device) ORDER BY day
                """),
            ("day_revenue", """
                SELECT json_build_object('kind', 'day_revenue', 'day', day, 'hour', hour, 'network', network, 'format', format,
                                         'country', country, 'currency', nullif(currency, ''), 'impressions', impressions, 'taps', taps,
                                         'revenue_micros', revenue_micros, 'unpriced_impressions', unpriced_impressions,
                                         'unpriced_taps', unpriced_taps)::text
                FROM install_day_revenue WHERE app_id = \(app) AND device = \(device) ORDER BY day, hour, network, format, country, currency
                """),
            ("pending", """
                SELECT json_build_object('kind', 'pending', 'bucket', bucket, 'network', network, 'format', format, 'country', country,
                                         'currency', nullif(currency, ''), 'first_at', first_at, 'events', events, 'requests', requests,
                                         'impressions', impressions, 'taps', taps, 'sessions', sessions, 'revenue_micros', revenue_micros)::text
                FROM install_delta WHERE app_id = \(app) AND device = \(device) ORDER BY bucket
                """),
            ("event", """
                SELECT json_build_object('kind', 'event', 'id', event_id, 'type', type, 'occurred_at', occurred_at, 'received_at', received_at,
                                         'network', nullif(network, ''), 'format', nullif(format, ''), 'placement', placement, 'size', size,
                                         'country', country, 'platform', platform, 'os_version', os_version, 'app_version', app_version,
                                         'revenue_micros', revenue_micros, 'currency', currency, 'revenue_precision', revenue_precision,
                                         'error_code', error_code, 'will_leave', will_leave, 'shown', shown)::text
                FROM events WHERE app_id = \(app) AND device = \(device) ORDER BY occurred_at, event_id
                """),
        ]
    }
}

import AdTallyCore
import Foundation
import PostgresKit

/// A device's data as NDJSON (GDPR Art. 15, DESIGN §15): what `GET
/// /v1/apps/{app}/devices/{device}` and `adtally devices show` give. Read a page at a
/// time (each its own short statement, after the page before's last key) and handed on
/// before the next is read: memory stays bounded whatever the device's history, and no
/// transaction waits on the reader.
///
/// Lines, each a JSON object with `kind`:
/// - `install`: its install row (first seen, cohort day, what it was first seen with);
/// - `pending`: sums of its newest events not yet folded into the rows below (read before
///   them: a fold between the two shows them twice, never not at all);
/// - `day`: each local day it was active (its events, requests, impressions, taps, sessions);
/// - `day_revenue`: its impressions, taps and money per day, UTC hour, network, format, country;
/// - `event`: each raw event still kept, oldest first;
/// - `end`: last, with the count of lines of each kind (`lines`: a reader knows the file is whole) and the
///   app's retention (`retention_days`; raw events before that are gone for every device).
public struct DeviceAccess: Sendable {
    let pool: PostgresPool

    /// Access over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Rows per page.
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

    /// Streams the device's lines to `write`, a page (complete lines) at a time; `write`
    /// awaiting the reader is what bounds memory. Each page is one short statement of its
    /// own, after the last row of the page before (keyset paging): no transaction or
    /// snapshot is held while the reader takes its time, so a slow reader holds back
    /// neither vacuum nor a partition drop (which ingest would then queue behind), and the
    /// pool's connection is free between pages.
    public func stream(app: String, device: String, retentionDays: Int, write: ([UInt8]) async throws -> Void) async throws {
        var counts: [(String, Int)] = []
        for part in Self.parts {
            var after: [String]?
            var count = 0
            repeat {
                let page = try await pool.query(part.page(app: app, device: device, after: after, limit: Self.chunk))
                var out: [UInt8] = []
                after = nil
                for row in page {
                    out.append(contentsOf: try row.decode(0, as: String.self).utf8)
                    out.append(0x0A)
                    after = try part.keys.indices.map { try row.decode($0 + 1, as: String.self) }
                }
                count += page.count
                if !out.isEmpty { try await write(out) }
                if page.count < Self.chunk || part.keys.isEmpty { after = nil }
            } while after != nil
            counts.append((part.kind, count))
        }
        let retention = try await pool.query("SELECT least(coalesce(retention_days, \(retentionDays)), \(retentionDays)) FROM apps WHERE app_id = \(app)")
            .first?.decode(0, as: Int.self) ?? retentionDays
        var summary = #"{"kind":"end","app":"# + Self.json(app) + #","device":"# + Self.json(device)
        summary += #","lines":{"# + counts.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
        summary += #","retention_days":\#(retention)}"# + "\n"
        try await write(Array(summary.utf8))
    }

    /// One kind of line: its table, its JSON, and the key its pages follow (the table's
    /// own order: its primary key after (app, device), or the events' (time, id)).
    struct Part: Sendable {
        var kind: String
        var table: String
        var json: String
        /// (column, type) of the key; empty: one page (the install row, the few pending sums).
        var keys: [(column: String, type: String)]

        func page(app: String, device: String, after: [String]?, limit: Int) -> PostgresQuery {
            let columns = keys.map(\.column).joined(separator: ", ")
            var query: PostgresQuery = "SELECT \(unsafeRaw: json)::text"
            for key in keys { query.append(", \(unsafeRaw: key.column)::text") }
            query.append(" FROM \(unsafeRaw: table) WHERE app_id = \(app) AND device = \(device)")
            if let after, !keys.isEmpty {
                // The first key alone too: PostgreSQL prunes partitions and bounds the index
                // scan by it (a row comparison alone it does not).
                query.append(" AND \(unsafeRaw: keys[0].column) >= \(after[0])::\(unsafeRaw: keys[0].type)")
                query.append(" AND (\(unsafeRaw: columns)) > (")
                for (index, key) in keys.enumerated() {
                    if index > 0 { query.append(", ") }
                    query.append("\(after[index])::\(unsafeRaw: key.type)")
                }
                query.append(")")
            }
            if !keys.isEmpty { query.append(" ORDER BY \(unsafeRaw: columns)") }
            // The pending sums: seconds of ingest, folded every few seconds; bounded all the same.
            query.append(" LIMIT \(keys.isEmpty ? 100_000 : limit)")
            return query
        }
    }

    /// A JSON string literal.
    static func json(_ text: String) -> String {
        let data = (try? JSONEncoder().encode(text)) ?? Data("\"\"".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    /// Each kind of line, in the order written.
    static let parts: [Part] = [
        Part(kind: "install", table: "installs", json: """
            json_build_object('kind', 'install', 'app', app_id, 'device', device, 'first_seen', first_seen, 'cohort', day,
                              'country', country, 'platform', platform, 'app_version', app_version)
            """, keys: []),
        Part(kind: "pending", table: "install_delta", json: """
            json_build_object('kind', 'pending', 'bucket', bucket, 'network', network, 'format', format, 'country', country,
                              'currency', nullif(currency, ''), 'first_at', first_at, 'events', events, 'requests', requests,
                              'impressions', impressions, 'taps', taps, 'sessions', sessions, 'revenue_micros', revenue_micros)
            """, keys: []),
        Part(kind: "day", table: "install_days", json: """
            json_build_object('kind', 'day', 'day', day, 'cohort', cohort, 'events', events, 'requests', requests,
                              'impressions', impressions, 'taps', taps, 'sessions', sessions)
            """, keys: [("day", "date")]),
        Part(kind: "day_revenue", table: "install_day_revenue", json: """
            json_build_object('kind', 'day_revenue', 'day', day, 'hour', hour, 'network', network, 'format', format,
                              'country', country, 'currency', nullif(currency, ''), 'impressions', impressions, 'taps', taps,
                              'revenue_micros', revenue_micros, 'unpriced_impressions', unpriced_impressions, 'unpriced_taps', unpriced_taps)
            """, keys: [("day", "date"), ("hour", "timestamptz"), ("network", "text"), ("format", "text"), ("country", "bpchar"), ("currency", "text")]),
        Part(kind: "exposure", table: "experiment_exposures", json: """
            json_build_object('kind', 'exposure', 'experiment', experiment, 'arm', arm, 'first_at', first_at)
            """, keys: [("experiment", "text")]),
        Part(kind: "event", table: "events", json: """
            json_build_object('kind', 'event', 'id', event_id, 'type', type, 'occurred_at', occurred_at, 'received_at', received_at,
                              'network', nullif(network, ''), 'format', nullif(format, ''), 'placement', placement, 'size', size,
                              'country', country, 'platform', platform, 'os_version', os_version, 'app_version', app_version,
                              'revenue_micros', revenue_micros, 'currency', currency, 'revenue_precision', revenue_precision,
                              'error_code', error_code, 'will_leave', will_leave, 'shown', shown)
            """, keys: [("occurred_at", "timestamptz"), ("event_id", "uuid")]),
    ]
}

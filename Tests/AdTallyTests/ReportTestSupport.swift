import AdTallyApp
import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import HummingbirdTesting
import Testing

/// Helpers shared by the report tests.
enum Reports {
    /// Raw events kept ten years: the fixtures lie in the past, and the server's
    /// retention pass would drop their partitions as it starts.
    static var flags: Settings.Flags {
        var flags = Settings.Flags()
        flags.retentionDays = 3650
        return flags
    }

    /// Microseconds since the epoch of an RFC 3339 UTC time (`2025-11-02T05:00:00Z`).
    static func micros(_ text: String) -> Int64 {
        let formatter = ISO8601DateFormatter()
        return Int64(formatter.date(from: text)!.timeIntervalSince1970) * 1_000_000
    }

    /// An event; `extra` sets the optional fields.
    static func event(
        _ type: EventType, at micros: Int64, network: String = "admob", format: AdFormat = .banner,
        _ extra: (inout AdEvent) -> Void = { _ in }
    ) -> AdEvent {
        var event = AdEvent(
            id: UUID(), type: type, occurredAtMicros: micros, network: network, format: format, country: "ZZ",
            revenueMicros: nil, currency: nil, errorCode: type == .error ? 1 : nil,
            willLeave: type == .tap ? false : nil, shown: type == .expiry ? true : nil
        )
        extra(&event)
        return event
    }

    /// Stores events for an app through the ingest path's store (ids, events, rollup deltas).
    static func store(_ services: AppServices, app: String, _ events: [AdEvent]) async throws {
        var start = 0
        while start < events.count {
            let chunk = events[start..<min(start + 2000, events.count)].map { AppEvent(appID: app, event: $0) }
            _ = try await services.eventStore.store(Array(chunk))
            start += 2000
        }
    }

    static func headers(_ secret: String) -> HTTPFields { [.authorization: "Bearer \(secret)"] }

    /// A report's JSON body and status.
    static func get(_ client: some TestClientProtocol, _ secret: String, _ query: String) async throws -> (status: HTTPResponse.Status, body: [String: Any]) {
        try await client.execute(uri: "/v1/reports?" + query, method: .get, headers: headers(secret)) { response in
            let object = try JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: Any] ?? [:]
            return (response.status, object)
        }
    }

    /// A report that must succeed: its rows.
    static func rows(_ client: some TestClientProtocol, _ secret: String, _ query: String, sourceLocation: SourceLocation = #_sourceLocation) async throws -> [[Any]] {
        let (status, body) = try await get(client, secret, query)
        #expect(status == .ok, "\(query): \(body)", sourceLocation: sourceLocation)
        return body["rows"] as? [[Any]] ?? []
    }

    /// Rows as `[first cell: last cell]`, e.g. date → requests, summed when the first cell repeats.
    static func map(_ rows: [[Any]]) -> [String: Int] {
        var result: [String: Int] = [:]
        for row in rows { result["\(row[0])", default: 0] += (row.last as? NSNumber)?.intValue ?? 0 }
        return result
    }

    /// Parses CSV strictly by RFC 4180 (CRLF records, quotes doubled inside quoted
    /// fields, nothing after a closing quote but a comma or the record's end);
    /// nil when the text breaks a rule.
    static func strictCSV(_ text: String) -> [[String]]? {
        var records: [[String]] = []
        var record: [String] = []
        var field = ""
        var scalars = Array(text.unicodeScalars)[...]
        var quoted = false, afterQuote = false, atFieldStart = true
        while let char = scalars.popFirst() {
            if quoted {
                if char == "\"" {
                    if scalars.first == "\"" { field.unicodeScalars.append("\""); scalars.removeFirst() } else { quoted = false; afterQuote = true }
                } else {
                    field.unicodeScalars.append(char)
                }
                continue
            }
            switch char {
            case "\"":
                guard atFieldStart else { return nil }
                quoted = true
                atFieldStart = false
            case ",":
                record.append(field); field = ""; afterQuote = false; atFieldStart = true
            case "\r":
                guard scalars.popFirst() == "\n" else { return nil }
                record.append(field); records.append(record); record = []; field = ""; afterQuote = false; atFieldStart = true
            case "\n":
                return nil
            default:
                guard !afterQuote else { return nil }
                field.unicodeScalars.append(char)
                atFieldStart = false
            }
        }
        guard !quoted, field.isEmpty, record.isEmpty else { return nil }
        return records
    }
}

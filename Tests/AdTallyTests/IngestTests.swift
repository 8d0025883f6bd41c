import AdTallyApp
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import PostgresKit
import Testing

/// Helpers shared by the ingest tests.
enum Ingest {
    static func event(
        _ id: UUID = UUID(), type: String = "request", at date: Date = Date(), network: String = "admob", extra: String = ""
    ) -> String {
        #"{"id":"\#(id.uuidString)","type":"\#(type)","occurred_at":"\#(date.formatted(.iso8601))","network":"\#(network)","format":"banner"\#(extra)}"#
    }

    static func body(_ events: [String]) -> ByteBuffer {
        ByteBuffer(string: #"{"events":[\#(events.joined(separator: ","))]}"#)
    }

    static func headers(_ secret: String, contentType: String = "application/json") -> HTTPFields {
        [.authorization: "Bearer \(secret)", .contentType: contentType]
    }

    /// Creates an app with an ingest key, a read key and an admin key.
    static func keys(_ services: AppServices, app: String = "demo") async throws -> (ingest: String, read: String, admin: String) {
        _ = try await services.appStore.createApp(id: app, name: nil)
        let ingest = try await services.appStore.createKey(app: app, scope: .ingest).secret
        let read = try await services.appStore.createKey(app: app, scope: .read).secret
        let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
        return (ingest, read, admin)
    }

    struct Receipt: Decodable {
        struct Rejected: Decodable {
            var index: Int
            var id: String?
            var error: String
        }
        var accepted: Int
        var duplicates: Int
        var rejected: [Rejected]
    }

    static func receipt(_ response: TestResponse) throws -> Receipt {
        guard response.status == .ok else {
            throw TestSetupError(description: "ingest answered \(response.status.code), not a receipt: \(String(buffer: response.body))")
        }
        return try JSONDecoder().decode(Receipt.self, from: Data(response.body.readableBytesView))
    }

    static func count(_ services: AppServices, _ sql: String) async throws -> Int {
        let rows = try await services.database.pool.query(PostgresQuery(unsafeSQL: sql))
        return try rows[0].decode(0, as: Int?.self) ?? 0
    }
}

@Suite("POST /v1/events")
struct IngestTests {
    @Test("valid events are stored, invalid ones listed by index with the field and rule")
    func mixedBatch() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let events = [
                Ingest.event(), Ingest.event(type: "impression", extra: #","revenue_micros":2500,"currency":"USD","country":"de""#),
                Ingest.event(network: "Bad Network"), #"{"id":"x"}"#,
            ]
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body(events)) { response in
                #expect(response.status == .ok)
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 2)
                #expect(receipt.duplicates == 0)
                #expect(receipt.rejected.map(\.index) == [2, 3])
                #expect(receipt.rejected[0].error == "network: must match [a-z0-9_.-]{1,32}")
                #expect(receipt.rejected[1].id == "x")
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 2)
            #expect(try await Ingest.count(services, "SELECT sum(requests + impressions)::int FROM rollup_15m") == 2)
            try await client.execute(uri: "/metrics", method: .get) { response in
                let text = String(buffer: response.body)
                #expect(response.status == .ok)
                #expect(text.contains(#"adtally_ingest_events_total{outcome="accepted"}"#))
                #expect(text.contains(#"adtally_ingest_events_total{outcome="rejected"}"#))
                #expect(text.contains("adtally_ingest_flush_seconds"))
            }
            #expect(try await Ingest.count(services, "SELECT sum(revenue_micros)::int FROM rollup_revenue_15m WHERE country = 'DE'") == 2500)
        }
    }

    @Test("NDJSON and gzip bodies are accepted; a bad NDJSON line is rejected alone")
    func ndjsonAndGzip() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let lines = [Ingest.event(), "{not json", Ingest.event()].joined(separator: "\n")
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest, contentType: "application/x-ndjson"),
                body: ByteBuffer(string: lines)
            ) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 2)
                #expect(receipt.rejected.first?.index == 1)
                #expect(receipt.rejected.first?.error.hasPrefix("line 2:") == true)
            }
            var headers = Ingest.headers(keys.ingest)
            headers[.contentEncoding] = "gzip"
            let gzipped = try gzip(Array(String(buffer: Ingest.body([Ingest.event(), Ingest.event()])).utf8))
            try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: ByteBuffer(bytes: gzipped)) { response in
                #expect(response.status == .ok)
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 2)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 4)
        }
    }

    @Test("missing, unknown and revoked keys are 401; a key of the wrong scope is 403")
    func authorization() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let body = Ingest.body([Ingest.event()])
            try await client.execute(uri: "/v1/events", method: .post, headers: [.contentType: "application/json"], body: body) { response in
                #expect(response.status == .unauthorized)
                #expect(response.headers[.wwwAuthenticate] != nil)
                #expect(response.headers[.contentType] == "application/problem+json")
            }
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers("atk_unknown"), body: body) { response in
                #expect(response.status == .unauthorized)
            }
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.read), body: body) { response in
                #expect(response.status == .forbidden)
            }
            try await client.execute(uri: "/v1/apps", method: .post, headers: Ingest.headers(keys.ingest), body: ByteBuffer(string: #"{"app":"x"}"#)) { response in
                #expect(response.status == .forbidden)
            }
            // Revoke the ingest key through the admin API: it stops working at once.
            let keyID = try await services.appStore.listKeys(app: "demo").first { $0.scope == .ingest }!.id
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: body) { response in
                #expect(response.status == .ok)
            }
            try await client.execute(uri: "/v1/keys/\(keyID)", method: .delete, headers: [.authorization: "Bearer \(keys.admin)"]) { response in
                #expect(response.status == .noContent)
            }
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: body) { response in
                #expect(response.status == .unauthorized)
            }
        }
    }

    @Test("too many events, too many bytes and a gzip bomb are 413; other media types are 415; bad JSON is 400")
    func limits() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let tooMany = Ingest.body((0..<1001).map { _ in Ingest.event() })
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: tooMany) { response in
                #expect(response.status == .contentTooLarge)
                #expect(String(buffer: response.body).contains("1000"))
            }
            let padding = String(repeating: " ", count: 1 << 20)
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest),
                body: ByteBuffer(string: #"{"events":[]\#(padding)}"#)
            ) { response in
                #expect(response.status == .contentTooLarge)
            }
            // 8 MiB of whitespace inflates from a few KiB: refused without inflating it all.
            var bomb = Ingest.headers(keys.ingest)
            bomb[.contentEncoding] = "gzip"
            let compressed = try gzip(Array(#"{"events":["#.utf8) + [UInt8](repeating: 0x20, count: 8 << 20) + Array("]}".utf8))
            #expect(compressed.count < 64 * 1024)
            try await client.execute(uri: "/v1/events", method: .post, headers: bomb, body: ByteBuffer(bytes: compressed)) { response in
                #expect(response.status == .contentTooLarge)
            }
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest, contentType: "text/plain"), body: Ingest.body([])
            ) { response in
                #expect(response.status == .unsupportedMediaType)
            }
            var brotli = Ingest.headers(keys.ingest)
            brotli[.contentEncoding] = "br"
            try await client.execute(uri: "/v1/events", method: .post, headers: brotli, body: Ingest.body([])) { response in
                #expect(response.status == .unsupportedMediaType)
            }
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: ByteBuffer(string: #"{"events": [}"#)
            ) { response in
                #expect(response.status == .badRequest)
                #expect(response.headers[.contentType] == "application/problem+json")
                #expect(String(buffer: response.body).contains("byte"))
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 0)
        }
    }

    @Test("the same batch sent twice is stored and counted once")
    func sameBatchTwice() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let batch = Ingest.body((0..<50).map { _ in Ingest.event() } + [Ingest.event(UUID(uuidString: "00000000-0000-4000-8000-000000000001")!)])
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: batch) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 51)
            }
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: batch) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 0)
                #expect(receipt.duplicates == 51)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 51)
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m") == 51)
        }
    }

    @Test("a batch that says it is sent for the first time but is not (a hostile client, a replayed POST) is still stored and counted once, and the redo is counted")
    func firstAttemptThatIsNot() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            var headers = Ingest.headers(keys.ingest)
            headers[HTTPField.Name("AdTally-Attempt")!] = "1"
            let events = (0..<50).map { _ in Ingest.event() }
            let batch = Ingest.body(events)
            for expected in [50, 0, 0] {
                try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: batch) { response in
                    let receipt = try Ingest.receipt(response)
                    #expect(receipt.accepted == expected && receipt.duplicates == 50 - expected)
                }
            }
            // Half known, half new, said to be new: the new half is stored, once.
            let mixed = Ingest.body(Array(events.prefix(25)) + (0..<25).map { _ in Ingest.event() })
            try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: mixed) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 25 && receipt.duplicates == 25)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 75)
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m") == 75)
            // The header was heeded: the three known batches skipped the probe, met their ids
            // in the COPY and were done again (the counter is the process's: at least these).
            try await client.execute(uri: "/metrics", method: .get) { response in
                let line = String(buffer: response.body).split(separator: "\n").first { $0.hasPrefix("adtally_ingest_claim_redos_total ") }
                #expect((line.flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0) >= 3, "\(String(describing: line))")
            }
        }
    }

    @Test("an id repeated inside one batch counts once")
    func duplicateWithinBatch() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let id = UUID()
            let batch = Ingest.body([Ingest.event(id), Ingest.event(id), Ingest.event(id, at: Date().addingTimeInterval(-86_400 * 3))])
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: batch) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 1)
                #expect(receipt.duplicates == 2)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 1)
        }
    }

    @Test("the same batch from 8 concurrent tasks is stored and counted once")
    func concurrentDuplicates() async throws {
        // A connection each, so that the 8 really run at once (one pipelined connection
        // answered them in turn, each one's read timeout counting the others' time).
        try await withTestApp(client: .ahc()) { services, client in
            let keys = try await Ingest.keys(services)
            let batch = Ingest.body((0..<100).map { _ in Ingest.event(type: "impression") })
            let receipts = try await withThrowingTaskGroup(of: (Int, Int).self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: batch) { response in
                            let receipt = try Ingest.receipt(response)
                            return (receipt.accepted, receipt.duplicates)
                        }
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(receipts.map(\.0).reduce(0, +) == 100)
            #expect(receipts.map(\.1).reduce(0, +) == 700)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 100)
            #expect(try await Ingest.count(services, "SELECT sum(impressions)::int FROM rollup_15m") == 100)
            #expect(try await Ingest.count(services, "SELECT sum(unpriced_impressions)::int FROM rollup_revenue_15m") == 100)
        }
    }

    @Test("events on both sides of a quarter-hour and a day boundary land in the right buckets and partitions")
    func boundaries() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            // Yesterday's UTC midnight, and 18:15 UTC the day before: midnight in Kathmandu (+05:45).
            let midnight = (Int(Date().timeIntervalSince1970) / 86_400) * 86_400
            let kathmanduMidnight = midnight - 86_400 + 18 * 3600 + 15 * 60 - 86_400
            func at(_ seconds: Int, _ micros: Int = 0) -> Date { Date(timeIntervalSince1970: Double(seconds) + Double(micros) / 1e6) }
            let events = [
                Ingest.event(at: at(midnight - 1, 999_000)), Ingest.event(at: at(midnight)),
                Ingest.event(at: at(kathmanduMidnight - 1)), Ingest.event(at: at(kathmanduMidnight)),
            ]
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body(events)) { response in
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 4)
            }
            let rows = try await services.database.pool.query("""
                SELECT extract(epoch FROM bucket)::bigint AS bucket, requests::int AS n FROM rollup_15m ORDER BY bucket
                """)
            let buckets = try rows.map { (try $0.decode("bucket", as: Int.self), try $0.decode("n", as: Int.self)) }
            #expect(buckets.map(\.0) == [kathmanduMidnight - 900, kathmanduMidnight, midnight - 900, midnight])
            #expect(buckets.allSatisfy { $0.1 == 1 })
            let partitions = try await services.database.pool.query("""
                SELECT tableoid::regclass::text AS part FROM events ORDER BY occurred_at
                """).map { try $0.decode("part", as: String.self) }
            // By time: two events on Kathmandu's midnight (one UTC day), then one each side of UTC midnight.
            #expect(partitions.count == 4)
            #expect(partitions[0] == partitions[1])
            #expect(Set(partitions).count == 3)
            #expect(partitions[2] < partitions[3])
        }
    }

    @Test("a full queue answers 503 with Retry-After at once, and nothing half-stored")
    func backpressure() async throws {
        try await withTestApp(batcher: .init(maxQueuedEvents: 5)) { services, client in
            let keys = try await Ingest.keys(services)
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body((0..<10).map { _ in Ingest.event() })
            ) { response in
                #expect(response.status == .serviceUnavailable)
                #expect(response.headers[.retryAfter] == "1")
                #expect(response.headers[.contentType] == "application/problem+json")
            }
            try await client.execute(
                uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body((0..<5).map { _ in Ingest.event() })
            ) { response in
                #expect(response.status == .ok)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 5)
        }
    }

    @Test("admin API: create an app, refuse a bad zone by name, create and list keys")
    func adminAPI() async throws {
        try await withTestApp { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let auth: HTTPFields = [.authorization: "Bearer \(admin)", .contentType: "application/json"]
            try await client.execute(uri: "/v1/apps", method: .post, headers: auth,
                                     body: ByteBuffer(string: #"{"app":"news","timezone":"Asia/Kathmandu","currency":"JPY"}"#)) { response in
                #expect(response.status == .created)
                #expect(String(buffer: response.body).contains("Asia/Kathmandu"))
            }
            try await client.execute(uri: "/v1/apps", method: .post, headers: auth,
                                     body: ByteBuffer(string: #"{"app":"news"}"#)) { response in
                #expect(response.status == .conflict)
            }
            try await client.execute(uri: "/v1/apps", method: .post, headers: auth,
                                     body: ByteBuffer(string: #"{"app":"other","timezone":"Mars/Olympus"}"#)) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("timezone"))
                #expect(String(buffer: response.body).contains("Mars/Olympus"))
            }
            try await client.execute(uri: "/v1/apps/news/keys", method: .post, headers: auth,
                                     body: ByteBuffer(string: #"{"scope":"ingest"}"#)) { response in
                #expect(response.status == .created)
                let key = try JSONDecoder().decode([String: String?].self, from: Data(response.body.readableBytesView))
                #expect(key["secret"]??.hasPrefix("atk_") == true)
                #expect(key["app"] == "news")
                #expect(key["scope"] == "ingest")
            }
            try await client.execute(uri: "/v1/apps/news/keys", method: .get, headers: auth) { response in
                #expect(response.status == .ok)
                #expect(!String(buffer: response.body).contains("atk_"))
            }
        }
    }
}

@Suite("Ingest with the database down")
struct DatabaseDownTests {
    @Test("ingest and readiness answer 503 with Retry-After when PostgreSQL is unreachable")
    func databaseUnreachable() async throws {
        let settings = try Settings.resolve(
            flags: .init(databaseURL: "host=127.0.0.1 port=1 dbname=nothing user=nobody connect_timeout=2", port: 0, poolSize: 2),
            environment: [:]
        )
        let database = try await Database.open(settings, logger: .init(label: "test"))
        let services = AppServices(settings: settings, database: database, logger: .init(label: "test"))
        let app = buildApplication(settings: settings, services: services, logger: .init(label: "test"))
        try await app.test(.live) { client in
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers("atk_" + String(repeating: "0", count: 48)), body: Ingest.body([])) { response in
                #expect(response.status == .serviceUnavailable)
                #expect(response.headers[.retryAfter] != nil)
            }
            try await client.execute(uri: "/readyz", method: .get) { response in
                #expect(response.status == .serviceUnavailable)
                #expect(String(buffer: response.body).contains("database unreachable"))
            }
        }
        await database.close()
    }
}

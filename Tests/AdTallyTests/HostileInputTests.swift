import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import PostgresKit
import Testing

/// Requests as an attacker holding an ingest key would send them (issue 7).
@Suite("Hostile ingest input")
struct HostileInputTests {
    static let validator = EventValidator(appID: "demo")
    static let now = Int64(Date().timeIntervalSince1970 * 1_000_000)

    static func raw(_ json: String) throws -> RawEvent {
        let slots = try EventBatchReader.readJSON(Array(#"{"events":[\#(json)]}"#.utf8))
        guard case .event(let raw) = slots.first else { throw TestSetupError(description: "not an event: \(json)") }
        return raw
    }

    @Test("a banner size with huge sides is refused, not a crash", arguments: ["99999999999999999999x1", "1x9223372036854775808", "12345x1", "1x00000"])
    func hugeBannerSize(size: String) throws {
        let raw = try Self.raw(Ingest.event(extra: #","size":"\#(size)""#))
        #expect(throws: EventValidator.Rejection(field: "size", rule: "must be WIDTHxHEIGHT in points, e.g. 320x50")) {
            try Self.validator.validate(raw, nowMicros: Self.now)
        }
    }

    @Test("a NUL byte in a query parameter is a 400 naming the rule, never a 500 (found by schemathesis)")
    func nulInParameters() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let rates = try await client.execute(uri: "/v1/rates?network=ad%00mob", method: .get, headers: [.authorization: "Bearer \(keys.read)"]) { $0 }
            #expect(rates.status == .badRequest && String(buffer: rates.body).contains("network: must match"))
            // Any route that lets one through answers 400 too (the boundary's net).
            for uri in ["/v1/fx?currency=U%00SD", "/v1/fx?base=E%00UR", "/v1/exports/a%00b"] {
                let status = try await client.execute(uri: uri, method: .get, headers: [.authorization: "Bearer \(keys.admin)"]) { $0.status }
                #expect(status.code >= 400 && status.code < 500, "\(uri): \(status)")
            }
        }
    }

    @Test("revenue_micros is bounded by the documented maximum")
    func revenueBound() throws {
        let most = EventValidator.maxRevenueMicros
        let accepted = try Self.validator.validate(
            try Self.raw(Ingest.event(type: "impression", extra: #","revenue_micros":\#(most),"currency":"USD""#)), nowMicros: Self.now
        )
        #expect(accepted.revenueMicros == most)
        for value in ["\(most + 1)", "9223372036854775807"] {
            let raw = try Self.raw(Ingest.event(type: "impression", extra: #","revenue_micros":\#(value),"currency":"USD""#))
            #expect(throws: EventValidator.Rejection(field: "revenue_micros", rule: "must be an integer from 0 to \(most)")) {
                try Self.validator.validate(raw, nowMicros: Self.now)
            }
        }
    }

    @Test("a field named twice in one event is refused, naming it")
    func duplicateKey() throws {
        let line = Ingest.event(extra: #","network":"unity""#)
        let slots = try EventBatchReader.readNDJSON(Array(line.utf8))
        guard case .unreadable(let reason) = slots.first else { Issue.record("accepted: \(slots)"); return }
        #expect(reason.contains(#"the field "network" appears twice"#))
        #expect(throws: BodyError.self) { try EventBatchReader.readJSON(Array(#"{"events":[\#(line)]}"#.utf8)) }
    }

    @Test("reading stops at the first event past the limit")
    func eventLimitWhileReading() throws {
        let json = Array((#"{"events":["# + Array(repeating: "{}", count: 5000).joined(separator: ",") + "]}").utf8)
        #expect(try EventBatchReader.readJSON(json, maxEvents: 5000).count == 5000)
        #expect(throws: BodyError.tooManyEvents(1000)) { try EventBatchReader.readJSON(json, maxEvents: 1000) }
        let ndjson = Array(Array(repeating: "{}", count: 1001).joined(separator: "\n\n").utf8)
        #expect(throws: BodyError.tooManyEvents(1000)) { try EventBatchReader.readNDJSON(ndjson, maxEvents: 1000) }
        #expect(try EventBatchReader.readNDJSON(ndjson, maxEvents: 1001).count == 1001)
    }

    @Test("max revenue twice in one batch, and 10,000 times in one transaction, sums exactly")
    func revenueSumsDoNotOverflow() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let most = EventValidator.maxRevenueMicros
            let extra = #","revenue_micros":\#(most),"currency":"USD""#
            let body = Ingest.body([Ingest.event(type: "impression", extra: extra), Ingest.event(type: "impression", extra: extra)])
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: body) { response in
                #expect(response.status == .ok)
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 2)
            }
            // 10,000 such events in one group commit: 10^19 micros, past a 64-bit sum.
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            let events = (0..<10_000).map { _ in
                AppEvent(appID: "demo", event: AdEvent(
                    id: UUID(), type: .impression, occurredAtMicros: now, network: "admob", format: .banner, revenueMicros: most, currency: "USD"
                ))
            }
            #expect(try await services.eventStore.store(events).allSatisfy { $0 })
            let total = "SELECT sum(revenue_micros)::text FROM rollup_revenue_15m"
            #expect(try await services.database.pool.query(PostgresQuery(unsafeSQL: total))[0].decode(0, as: String.self) == "10002000000000000000")
            try await services.compactor.compactOnce()
            #expect(try await services.database.pool.query(PostgresQuery(unsafeSQL: total))[0].decode(0, as: String.self) == "10002000000000000000")
            // And compaction keeps working after totals pass 2^63.
            try await services.eventStore.store(Array(events.prefix(1)).map {
                var copy = $0
                copy.event.id = UUID()
                return copy
            })
            try await services.compactor.compactOnce()
            #expect(try await services.database.pool.query(PostgresQuery(unsafeSQL: total))[0].decode(0, as: String.self) == "10003000000000000000")
        }
    }

    @Test("a body of several gzip members is inflated whole; trailing garbage is 400")
    func gzipMembers() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            var headers = Ingest.headers(keys.ingest, contentType: "application/x-ndjson")
            headers[.contentEncoding] = "gzip"
            let first = try gzip(Array(((0..<3).map { _ in Ingest.event() }.joined(separator: "\n") + "\n").utf8))
            let second = try gzip(Array(((0..<3).map { _ in Ingest.event() }.joined(separator: "\n") + "\n").utf8))
            try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: ByteBuffer(bytes: first + second)) { response in
                #expect(response.status == .ok)
                let receipt = try Ingest.receipt(response)
                #expect(receipt.accepted == 6)
            }
            let third = try gzip(Array((Ingest.event() + "\n").utf8))
            try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: ByteBuffer(bytes: third + Array("garbage".utf8))) { response in
                #expect(response.status == .badRequest)
            }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 6)
        }
    }

    @Test("a 1 MiB body of empty objects is 413 before it is parsed whole")
    func tinyElements() async throws {
        try await withTestApp { services, client in
            let keys = try await Ingest.keys(services)
            let body = ByteBuffer(string: #"{"events":["# + Array(repeating: "{}", count: 340_000).joined(separator: ",") + "]}")
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: body) { response in
                #expect(response.status == .contentTooLarge)
                #expect(String(buffer: response.body).contains("more than 1000 events"))
            }
        }
    }

    /// Peak RSS of a real server while 64 requests of 1 MiB of `{},{},…` are in flight.
    /// Parsed whole, each became ~350 k slots (100+ MB); stopped at event 1,001, each
    /// holds its 1 MiB body and at most 1,001 slots.
    @Test("64 oversized requests in flight keep the server within its memory bound")
    func memoryBound() async throws {
        try await withServeProcess(app: "rss") { server, secret, client in
            do {
                let port = server.port
                let before = try server.peakRSS()
                let body = ByteBuffer(string: #"{"events":["# + Array(repeating: "{}", count: 349_000).joined(separator: ",") + "]}")
                // One first, so the key is in the server's cache: 64 first lookups at once on
                // a loaded machine can wait past the auth pool's timeout (a 503), which is not
                // what this test measures.
                var warm = HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/events")
                warm.method = .POST
                warm.headers.add(name: "Authorization", value: "Bearer \(secret)")
                warm.headers.add(name: "Content-Type", value: "application/json")
                warm.body = .bytes(body)
                #expect(try await client.execute(warm, timeout: .seconds(60)).status.code == 413)
                let statuses = try await withThrowingTaskGroup(of: UInt.self) { group in
                    for _ in 0..<64 {
                        group.addTask {
                            var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/events")
                            request.method = .POST
                            request.headers.add(name: "Authorization", value: "Bearer \(secret)")
                            request.headers.add(name: "Content-Type", value: "application/json")
                            request.body = .bytes(body)
                            return try await client.execute(request, timeout: .seconds(60)).status.code
                        }
                    }
                    return try await group.reduce(into: [UInt]()) { $0.append($1) }
                }
                #expect(statuses.allSatisfy { $0 == 413 }, "statuses: \(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
                let growth = try server.peakRSS() - before
                // Each request: its 1 MiB body, the NIO read buffers and 1,001 slots.
                print("peak RSS growth with 64 oversized requests in flight: \(growth / 1_048_576) MiB")
                #expect(growth < 64 * 3 * 1_048_576)
            }
        }
    }
}

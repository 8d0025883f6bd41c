import AdTallyCore
import Foundation
import Testing

@Suite("Event validation rules")
struct EventValidatorTests {
    static let now = Int64(1_763_720_000) * 1_000_000  // 2025-11-21T10:13:20Z
    static let nowText = "2025-11-21T10:13:20Z"

    static func raw(_ fields: [String: RawValue], remove: [String] = []) -> RawEvent {
        var event = RawEvent()
        let base: [String: RawValue] = [
            "id": .string("6f1c1d8e-1f7a-4a3e-9a57-3c1e1b2a0001"), "type": .string("request"),
            "occurred_at": .string(nowText), "network": .string("admob"), "format": .string("banner"),
        ]
        for (name, value) in base.merging(fields, uniquingKeysWith: { $1 }) where !remove.contains(name) {
            event.set(name, value)
        }
        return event
    }

    func rejection(_ fields: [String: RawValue], remove: [String] = []) -> String? {
        let event = Self.raw(fields, remove: remove)
        do {
            _ = try EventValidator(appID: "demo").validate(event, nowMicros: Self.now)
            return nil
        } catch {
            return error.description
        }
    }

    @Test("a minimal valid event gets the documented defaults")
    func minimalEvent() throws {
        let event = try EventValidator(appID: "demo").validate(Self.raw([:]), nowMicros: Self.now)
        #expect(event.placement == "default")
        #expect(event.country == "ZZ")
        #expect(event.type == .request)
        #expect(event.occurredAtMicros == Self.now)
    }

    @Test("every rule names its field", arguments: [
        (["id": RawValue.string("nope")], [String](), "id: must be a UUID"),
        ([:], ["id"], "id: is required"),
        (["type": .string("click")], [], "type: must be one of"),
        ([:], ["type"], "type: is required"),
        (["occurred_at": .string("2025-11-21 10:13:20")], [], "occurred_at: must be an RFC 3339 timestamp with an offset"),
        (["occurred_at": .string("2025-11-21T10:13:20")], [], "occurred_at: must be an RFC 3339 timestamp with an offset"),
        (["occurred_at": .string("2025-02-30T10:13:20Z")], [], "occurred_at: must be an RFC 3339"),
        (["occurred_at": .string("2025-11-14T10:13:19Z")], [], "occurred_at: is more than 7 days in the past"),
        (["occurred_at": .string("2025-11-21T11:13:21Z")], [], "occurred_at: is more than 1 hour ahead"),
        (["occurred_at": .number("1763720000")], [], "occurred_at: must be a string, got a number"),
        (["network": .string("AdMob")], [], "network: must match [a-z0-9_.-]{1,32}"),
        (["network": .string(String(repeating: "a", count: 33))], [], "network: must match"),
        (["network": .number("1")], [], "network: must be a string"),
        (["format": .string("video")], [], "format: must be one of banner, interstitial, native, rewarded"),
        (["placement": .string("")], [], "placement: must be 1 to 64 characters (at most 256 bytes of UTF-8)"),
        (["placement": .string(String(repeating: "p", count: 65))], [], "placement: must be 1 to 64 characters (at most 256 bytes of UTF-8)"),
        (["size": .string("320X50")], [], "size: must be WIDTHxHEIGHT"),
        (["size": .string("x50")], [], "size: must be WIDTHxHEIGHT"),
        (["country": .string("XX")], [], "country: must be an ISO 3166-1 alpha-2 code"),
        (["country": .string("USA")], [], "country: must be an ISO 3166-1 alpha-2 code"),
        (["platform": .string("windows")], [], "platform: must be one of ios, ipados, android, other"),
        (["os_version": .string(String(repeating: "1", count: 33))], [], "os_version: must be at most 32 characters (128 bytes of UTF-8)"),
        (["app_version": .string(String(repeating: "1", count: 33))], [], "app_version: must be at most 32 characters (128 bytes of UTF-8)"),
        (["device": .string(String(repeating: "d", count: 65))], [], "device: must be at most 64 characters (256 bytes of UTF-8)"),
        (["type": .string("impression"), "revenue_micros": .number("10")], [], "currency: is required with revenue_micros"),
        (["type": .string("impression"), "currency": .string("USD")], [], "revenue_micros: is required with currency"),
        (["type": .string("impression"), "revenue_micros": .number("-1"), "currency": .string("USD")], [], "revenue_micros: must be an integer from 0 to 1000000000000000"),
        (["type": .string("impression"), "revenue_micros": .number("1.5"), "currency": .string("USD")], [], "revenue_micros: must be a 64-bit integer"),
        (["type": .string("impression"), "revenue_micros": .number("10"), "currency": .string("ABC")], [], "currency: must be an ISO 4217 currency code"),
        (["revenue_micros": .number("10"), "currency": .string("USD")], [], "revenue_micros: is allowed only on impression and tap events"),
        (["error_code": .number("3")], [], "error_code: is allowed only on error events"),
        (["type": .string("error")], [], "error_code: is required on error events"),
        (["type": .string("error"), "error_code": .string("3")], [], "error_code: must be an integer, got a string"),
        (["will_leave": .bool(true)], [], "will_leave: is allowed only on tap events"),
        (["type": .string("tap"), "will_leave": .string("yes")], [], "will_leave: must be a boolean"),
        (["type": .string("expiry")], [], "shown: is required on expiry events"),
        (["shown": .bool(false)], [], "shown: is allowed only on expiry events"),
        (["app": .string("other-app")], [], "app: must equal the key's app (demo)"),
        (["network": .composite], [], "network: must be a string, got an array or object"),
        (["placement": .string("a\u{0}b")], [], "placement: must not contain NUL (U+0000) characters"),
        (["device": .string("\u{0}")], [], "device: must not contain NUL (U+0000) characters"),
        (["type": .string("session")], [], "network: must be absent on session events"),
        (["type": .string("session")], ["network"], "format: must be absent on session events"),
        (["type": .string("session"), "placement": .string("home")], ["network", "format"], "placement: must be absent on session events"),
        (["type": .string("session"), "size": .string("320x50")], ["network", "format"], "size: must be absent on session events"),
        (["type": .string("impression"), "revenue_precision": .string("precise")], [], "revenue_precision: is allowed only with revenue_micros"),
        (["type": .string("impression"), "revenue_micros": .number("10"), "currency": .string("USD"), "revenue_precision": .string("exact")], [],
         "revenue_precision: must be one of precise, estimated, publisher_provided, unknown"),
    ])
    func rules(fields: [String: RawValue], remove: [String], expected: String) {
        let message = rejection(fields, remove: remove)
        #expect(message?.hasPrefix(expected) == true, "got \(message ?? "no rejection")")
    }

    @Test("a session names no network or format; revenue precision is kept with revenue")
    func sessionAndPrecision() throws {
        let session = try EventValidator(appID: "demo").validate(Self.raw(["type": .string("session"), "device": .string("d")], remove: ["network", "format"]), nowMicros: Self.now)
        #expect(session.type == .session && session.network == EventValidator.noNetwork && session.format == nil && session.device == "d")
        let paid = try EventValidator(appID: "demo").validate(Self.raw([
            "type": .string("impression"), "revenue_micros": .number("1500"), "currency": .string("USD"), "revenue_precision": .string("publisher_provided"),
        ]), nowMicros: Self.now)
        #expect(paid.revenuePrecision == .publisherProvided)
    }

    @Test("valid optional fields are kept, country upper-cased")
    func optionalFieldsKept() throws {
        let event = try EventValidator(appID: "demo").validate(Self.raw([
            "type": .string("impression"), "revenue_micros": .number("1500"), "currency": .string("JPY"),
            "country": .string("jp"), "size": .string("320x50"), "platform": .string("ios"), "app": .string("demo"),
            "placement": .string("home_banner"), "device": .string("dev-1"), "os_version": .string("18.1"),
            "occurred_at": .string("2025-11-21T15:58:20+05:45"),
        ]), nowMicros: Self.now)
        #expect(event.country == "JP")
        #expect(event.revenueMicros == 1500)
        #expect(event.currency == "JPY")
        #expect(event.size == "320x50")
        #expect(event.platform == .ios)
        #expect(event.occurredAtMicros == Self.now)  // 15:58:20+05:45 is 10:13:20Z
    }

    @Test("length limits count characters, not bytes")
    func lengthsInCharacters() throws {
        let validator = EventValidator(appID: "demo")
        // 64 and 32 three-byte characters: more bytes than the limits, as many characters.
        let event = try validator.validate(Self.raw([
            "placement": .string(String(repeating: "日", count: 64)), "os_version": .string(String(repeating: "é", count: 32)),
        ]), nowMicros: Self.now)
        #expect(event.placement.count == 64)
        #expect(rejection(["placement": .string(String(repeating: "日", count: 65))]) == "placement: must be 1 to 64 characters (at most 256 bytes of UTF-8)")
        #expect(rejection(["os_version": .string(String(repeating: "é", count: 33))]) == "os_version: must be at most 32 characters (128 bytes of UTF-8)")
    }

    @Test("CSV text values parse as numbers and booleans, and empty cells are absent")
    func textValues() throws {
        var raw = Self.raw(["type": .string("tap"), "will_leave": .string("true"), "revenue_micros": .string("7"), "currency": .string("EUR")])
        raw.set("size", .string(""))
        let event = try EventValidator(appID: "demo", acceptsTextValues: true).validate(raw, nowMicros: Self.now)
        #expect(event.willLeave == true)
        #expect(event.revenueMicros == 7)
        #expect(event.size == nil)
    }

    @Test("15-minute buckets split exactly at quarter hours, also before 1970")
    func buckets() {
        func bucket(_ micros: Int64) -> Int64 {
            AdEvent(id: UUID(), type: .request, occurredAtMicros: micros, network: "n", format: .banner).bucketStartSeconds
        }
        let quarter: Int64 = 1_763_720_100  // 10:15:00Z
        #expect(bucket(quarter * 1_000_000) == quarter)
        #expect(bucket(quarter * 1_000_000 - 1) == quarter - 900)
        #expect(bucket(-1) == -900)
        #expect(bucket(0) == 0)
    }
}

@Suite("Reading event batches")
struct EventBatchReaderTests {
    @Test("a JSON body yields one slot per element; non-objects are unreadable slots")
    func jsonBody() throws {
        let body = #"{"meta": {"x": [1, 2, {"y": null}]}, "events": [{"id": "a\u00e9\ud83d\ude00\n", "n": 1.5e3, "b": true, "nested": {"k": [1]}}, 7, {"type": "tap"}]}"#
        let slots = try EventBatchReader.readJSON(Array(body.utf8))
        #expect(slots.count == 3)
        guard case .event(let first) = slots[0] else { Issue.record("first is not an event"); return }
        #expect(first.id == .string("aé😀\n"))
        #expect(slots[1] == .unreadable("event must be a JSON object, got a number"))
    }

    @Test("unreadable JSON is a body error that says where", arguments: [
        #"{"events": [{"id": "x"}"#, #"{"events": [{"id": "x",}]}"#, #"[{"id": 1}]"#, #"{"events": 5}"#, #"{"other": []}"#,
        "{\"events\": [{\"id\": \"a\u{01}b\"}]}", #"{"events": [{"id": "\ud800"}]}"#, #"{"events": []} trailing"#,
    ])
    func unreadable(body: String) {
        #expect(throws: BodyError.self) { try EventBatchReader.readJSON(Array(body.utf8)) }
    }

    @Test("escaped field names mean the same field")
    func escapedKeys() throws {
        let slots = try EventBatchReader.readJSON(Array(#"{"events": [{"ty\u0070e": "tap", "\u0069d": "x"}]}"#.utf8))
        guard case .event(let event) = slots.first else { Issue.record("not an event"); return }
        #expect(event.type == .string("tap"))
        #expect(event.id == .string("x"))
    }

    @Test("invalid UTF-8 in a string is a body error")
    func invalidUTF8() {
        let bytes = Array(#"{"events": [{"id": ""#.utf8) + [0xC3, 0x28] + Array(#""}]}"#.utf8)
        #expect(throws: BodyError.self) { try EventBatchReader.readJSON(bytes) }
    }

    @Test("NDJSON: blank lines are skipped and a bad line loses only itself")
    func ndjson() throws {
        let body = "{\"type\":\"request\"}\n\n{broken\n  \n{\"type\":\"tap\"}\r\n[1]\n"
        let slots = try EventBatchReader.readNDJSON(Array(body.utf8))
        #expect(slots.count == 4)
        if case .unreadable(let reason) = slots[1] { #expect(reason.hasPrefix("line 3:")) } else { Issue.record("line 3 should be unreadable") }
        if case .event(let event) = slots[2] { #expect(event.type == .string("tap")) } else { Issue.record("line 5 should be an event") }
        #expect(slots[3] == .unreadable("line 6: event must be a JSON object"))
    }

    @Test("CSV records honour quotes, doubled quotes, embedded line breaks and CRLF")
    func csv() {
        var reader = CSVRecordReader()
        var records = reader.feed(Array("id,placement\r\n1,\"a,b\"\r\n2,\"say \"\"hi\"\"\"\n3,\"two\nlines\"\n\n4,".utf8))
        if let last = reader.finish() { records.append(last) }
        #expect(records.map(\.fields) == [["id", "placement"], ["1", "a,b"], ["2", "say \"hi\""], ["3", "two\nlines"], ["4", ""]])
        #expect(records.map(\.line) == [1, 2, 3, 4, 7])
    }

    @Test("RFC 3339 offsets, fractions and leap days")
    func rfc3339() {
        #expect(RFC3339.parseMicros("2026-03-29T01:30:00+05:45") == RFC3339.parseMicros("2026-03-28T19:45:00Z"))
        #expect(RFC3339.parseMicros("2024-02-29T00:00:00.5Z") == 1_709_164_800_500_000)
        #expect(RFC3339.parseMicros("2023-02-29T00:00:00Z") == nil)
        #expect(RFC3339.parseMicros("2026-03-28T19:45:00+0545") == nil)
    }
}

import AdTallyApp
import AdTallyCore
import AdTallyStorage
import Foundation
import Testing

/// What files and text cells an attacker or a spreadsheet can bring (issue 22, items 6–8, 12).
extension HostileInputTests {
    static let bom = "\u{FEFF}"

    @Test("a UTF-8 byte-order mark starts a CSV, JSON or NDJSON file without changing its first field, in whatever chunks it arrives")
    func byteOrderMarks() throws {
        let bytes = Array((Self.bom + "\"id\",type\r\n1,tap\r\n").utf8)
        #expect(CSVRecordReader.records(of: bytes).map(\.fields) == [["id", "type"], ["1", "tap"]])
        var reader = CSVRecordReader()
        var records = bytes.flatMap { reader.feed([$0]) }
        if let last = reader.finish() { records.append(last) }
        #expect(records.map(\.fields) == [["id", "type"], ["1", "tap"]])
        // Bytes that only start like a mark are kept.
        #expect(CSVRecordReader.records(of: [0xEF, 0x41, 0x0A]).map(\.fields) == [["\u{FFFD}A"]])

        let event = Ingest.event()
        #expect(try EventBatchReader.readJSON(Array((Self.bom + #"{"events":[\#(event)]}"#).utf8)).count == 1)
        let ndjson = try EventBatchReader.readNDJSON(Array((Self.bom + event + "\n" + event).utf8))
        #expect(ndjson.allSatisfy { if case .event = $0 { true } else { false } } && ndjson.count == 2)
    }

    @Test("FX and rate-card CSVs from Excel (a BOM, lower-case codes) import; a lower-case ECB column is not called retired")
    func spreadsheetMoneyFiles() throws {
        var skipped = Set<String>()
        let ecb = try FXRate.parseCSV(Array((Self.bom + "Date,usd,Jpy,CYP,\n2025-11-03,1.1,160,0.58,\n").utf8), base: "eur", skipped: &skipped)
        #expect(ecb.map { "\($0.base) \($0.currency) \($0.rate)" } == ["EUR USD 1.1", "EUR JPY 160"])
        #expect(skipped == ["CYP"])
        let long = try FXRate.parseCSV(Array((Self.bom + "date,currency,rate\n2025-11-03,usd,1.1\n").utf8), base: "EUR")
        #expect(long.map(\.currency) == ["USD"])
        let card = try RateCardEntry.parseCSV(Array((Self.bom + "network,format,country,currency,cpm,cpt,effective_from\nadmob,banner,jp,usd,1.5,0.1,2025-11-01\n").utf8))
        #expect(card.map { "\($0.country) \($0.currency)" } == ["JP USD"])
    }

    @Test("adtally ingest reads a CSV saved by Excel as \"CSV UTF-8\" (with a BOM)")
    func ingestCSVWithBOM() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "files", name: nil)
            let now = Date().formatted(.iso8601)
            let url = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-\(UUID().uuidString)-bom.csv")
            defer { try? FileManager.default.removeItem(at: url) }
            try (Self.bom + "id,type,occurred_at,network,format,revenue_micros,currency\r\n\(UUID().uuidString),impression,\(now),admob,banner,1200,usd\r\n")
                .write(to: url, atomically: true, encoding: .utf8)
            let result = try await FileImporter(store: services.eventStore, appID: "files", batchSize: 1000).importFiles([url.path])
            #expect(result.accepted == 1 && result.rejected == 0, "\(result.firstRejections)")
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events WHERE currency = 'USD'") == 1)
        }
    }

    @Test("country codes are ASCII letters only: a dotless i or a ligature does not fold into a code")
    func asciiCountryCodes() {
        #expect(EventValidator.countryCode("in") == "IN")
        #expect(EventValidator.countryCode("JP") == "JP")
        for text in ["ın", "İN", "ﬁ", "ſe", "J", "JPN", "Jp\u{301}"] {
            #expect(EventValidator.countryCode(text) == nil, "\(text)")
        }
        #expect(ISOCodes.currency("usd") == "USD" && ISOCodes.currency("uſd") == nil)
    }

    @Test("every CSV cell a spreadsheet could run as a formula is neutralised, Unicode spaces and full-width signs included")
    func formulaPrefixes() {
        func csv(_ text: String) -> String {
            var out: [UInt8] = []
            ReportText.appendCSVText(text, to: &out)
            return String(decoding: out, as: UTF8.self)
        }
        let formulas = [
            "=1+1", "+1", "-1", "@SUM(A1)", " =1", "\t=1", "\t1", "\r=1", "\n=1", "\r\n=1", "\u{A0}=1", "\u{3000}=1", "\u{FEFF}=1",
            "\u{2007}+1", "＝1+1", "＋1", "－1", "＠SUM(A1)", "\u{3000}＝1", "﹦1", "\u{2212}1",
        ]
        for text in formulas {
            let cell = csv(text)
            #expect(cell.hasPrefix("\"'"), "\(text.unicodeScalars.map { String($0.value, radix: 16) }): \(cell)")
        }
        for text in ["a=1", "日本", "1", "ad-mob", " a", "\u{A0}a"] {
            #expect(!csv(text).hasPrefix("\"'"), "\(text)")
        }
    }
}

extension HostileInputTests {
    @Test("one length rule in characters and UTF-8 bytes for every text field: at ingest, in report filters and in mediation policies")
    func textLengthsInBytesAndCharacters() async throws {
        // One letter and 500,000 combining marks: one character, 1 MB.
        let zalgo = "a" + String(repeating: "\u{301}", count: 500_000)
        let japanese = String(repeating: "日", count: 22)  // 66 bytes
        #expect(!EventValidator.isPlacement(zalgo) && !EventValidator.isPlacement("a" + String(repeating: "\u{301}", count: 200)))
        #expect(EventValidator.isPlacement(japanese) && EventValidator.isPlacement(String(repeating: "日", count: 64)))
        #expect(throws: EventValidator.Rejection(field: "placement", rule: EventValidator.placementRule)) {
            try Self.validator.validate(try Self.raw(Ingest.event(extra: #","placement":"\#(zalgo)""#)), nowMicros: Self.now)
        }
        #expect(throws: EventValidator.Rejection(field: "device", rule: "must be at most 64 characters (256 bytes of UTF-8)")) {
            try Self.validator.validate(try Self.raw(Ingest.event(extra: #","device":"\#(zalgo.prefix(1000))""#)), nowMicros: Self.now)
        }
        #expect(throws: FieldError.self) {
            try MediationPolicy(scope: .init(app: "demo", placement: String(zalgo.prefix(20_000))), rule: .pinned, network: "admob").validated()
        }
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Reports.store(services, app: "demo", [Reports.event(.request, at: Reports.micros("2025-11-03T05:00:00Z")) { $0.placement = japanese }])
            let encoded = try #require(japanese.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
            let rows = try await Reports.rows(client, keys.read, "from=2025-11-03&to=2025-11-03&tz=UTC&dimensions=placement&metrics=requests&placement=\(encoded)")
            #expect(Reports.map(rows) == [japanese: 1])
            let long = try #require(("a" + String(repeating: "\u{301}", count: 130)).addingPercentEncoding(withAllowedCharacters: .alphanumerics))
            let (status, body) = try await Reports.get(client, keys.read, "from=2025-11-03&to=2025-11-03&tz=UTC&placement=\(long)")
            #expect(status == .badRequest && (body["detail"] as? String ?? "").hasPrefix("placement:"), "\(body)")
        }
    }
}

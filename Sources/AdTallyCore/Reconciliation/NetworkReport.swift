import Foundation

/// Where a network report comes from (DESIGN §11): each network's own report, in the
/// shape it documents, or a generic CSV.
public enum NetworkReportSource: String, Sendable, CaseIterable, Codable {
    /// AdMob API `networkReport:generate` / `mediationReport:generate` (a JSON stream:
    /// header, rows, footer), days in the account's zone (America/Los_Angeles by default).
    case admob
    /// AppLovin MAX `maxReport`, CSV or JSON, days in UTC, revenue in USD.
    case max
    /// LevelPlay (ironSource) reporting API JSON, days in UTC, revenue in USD.
    case levelplay
    /// `date,app,network,format,country,impressions,clicks,revenue,currency[,timezone]`.
    case csv

    /// The zone a source's days are in when the file does not say.
    /// What a file of this source holds, as an error says it.
    public var expectedShape: String {
        switch self {
        case .admob: "an AdMob report (the JSON of networkReport:generate or mediationReport:generate: a header, rows, a footer; or the AdMob dashboard's CSV export with Date, App, Format, Impressions and Estimated earnings columns)"
        case .max: "a MAX report (CSV with day, package_name or application, network, ad_format, country, impressions, estimated_revenue, as the API or the MAX dashboard's export writes it; or its JSON with results)"
        case .levelplay: "a LevelPlay report (a JSON array of rows with date, appKey, adFormat or adUnits, adNetwork or providerName, countryCode, impressions, revenue; or the LevelPlay dashboard's CSV export with Date, App Key, Ad Unit, Ad Source, Impressions and Revenue columns)"
        case .csv: "the generic CSV (a header naming date, app, network, format, country, impressions, clicks, revenue, currency, then a line per row)"
        }
    }

    public var defaultZone: String {
        switch self {
        case .admob: "America/Los_Angeles"
        case .max, .levelplay, .csv: "UTC"
        }
    }
}

/// One line of a network's report as read: the network's own names for the app and
/// the network (mapped to AdTally's by `NetworkMappings`), a day in the report's zone.
public struct NetworkReportLine: Sendable, Equatable {
    /// Where it is in the file: a line of a CSV, a row of a JSON report (1-based).
    public var position: String
    /// Days since 1970-01-01, a date in the report's zone.
    public var day: Int
    /// The network's id for the app (AdMob's `ca-app-pub-…~…`, MAX's package name, LevelPlay's app key, or an AdTally app id).
    public var app: String
    /// The network's name for the ad source as written ("AdMob Network", "APPLOVIN_NETWORK", "ironSource", "admob").
    public var network: String
    /// AdTally's format (each source's vocabulary mapped, DESIGN §11).
    public var format: AdFormat
    /// ISO 3166-1 alpha-2, or nil where the network does not know it.
    public var country: String?
    public var impressions: Int64
    /// Nil where the report has no clicks (MAX's).
    public var clicks: Int64?
    /// Earnings in micros of `currency`, rounded half up from the network's decimals.
    public var revenueMicros: Int64
    public var currency: String

    public init(
        position: String, day: Int, app: String, network: String, format: AdFormat, country: String?,
        impressions: Int64, clicks: Int64?, revenueMicros: Int64, currency: String
    ) {
        self.position = position
        self.day = day
        self.app = app
        self.network = network
        self.format = format
        self.country = country
        self.impressions = impressions
        self.clicks = clicks
        self.revenueMicros = revenueMicros
        self.currency = currency
    }
}

/// A network's report, read and validated, before its names are mapped.
public struct NetworkReport: Sendable, Equatable {
    public var source: NetworkReportSource
    /// The IANA zone its days are in.
    public var zone: String
    public var lines: [NetworkReportLine]
    /// The network's warnings about its data, as `TYPE: description` (AdMob's footer).
    public var warnings: [String]
    /// The network said its data for the range is late (AdMob's `DATA_DELAYED`): no day of it is final.
    public var isDelayed: Bool
    /// The days the report covers (its header's range, else its lines'), in `zone`.
    public var firstDay: Int?
    public var lastDay: Int?
    /// The file states its range (AdMob's header): a day of it without a line is a zero.
    /// Other files cover only the days they have lines for.
    public var hasRange: Bool
    /// Lines left out because AdTally has nothing to compare them with (LevelPlay's
    /// offerwall), by what they were: said in the import's answer, never silent.
    public var leftOut: [String: Int]

    public init(
        source: NetworkReportSource, zone: String, lines: [NetworkReportLine], warnings: [String] = [], isDelayed: Bool = false,
        firstDay: Int? = nil, lastDay: Int? = nil, leftOut: [String: Int] = [:]
    ) {
        // Half a range states none: then both ends are the lines' (one from a header and one
        // from the lines could put lines outside the report's own days; found by make fuzz).
        hasRange = firstDay != nil && lastDay != nil
        self.source = source
        self.zone = zone
        self.lines = lines
        self.warnings = warnings
        self.isDelayed = isDelayed
        self.firstDay = hasRange ? firstDay : lines.map(\.day).min()
        self.lastDay = hasRange ? lastDay : lines.map(\.day).max()
        self.leftOut = leftOut
    }

    /// Most bytes of a network report file, in the API and the CLI: a year of a large
    /// account's daily rows by app, network, format and country fits in it.
    public static let maxBytes = 32 << 20
    /// Most lines of one report.
    public static let maxLines = 500_000
    /// Most JSON objects (`{`) of one report: a month of a large AdMob account's rows by
    /// app, format and country is well under it.
    public static let maxJSONObjects = 1_500_000
    /// Most JSON members (`"key": value`) of one report: an AdMob row has about 22, so a
    /// month of a large account (48,000 rows by app, format and country) is about 1 M.
    public static let maxJSONMembers = 1_500_000
    /// Longest line of a CSV report.
    public static let maxLineBytes = 65_536

    /// Reads a report in `source`'s shape; `zone` overrides the zone it is in (a generic
    /// CSV's `--timezone`, an AdMob account whose reports are in UTC). Every error names
    /// the line (or row) and the field, and nothing of a refused file is kept.
    ///
    /// A file a person chose that holds no line the source's shape recognises is the
    /// wrong file; an API's answer for days without traffic may be empty (`fromAPI`).
    public static func parse(
        _ file: consuming [UInt8], source: NetworkReportSource, zone: String? = nil, now: Date = Date(), fromAPI: Bool = false
    ) throws(FieldError) -> NetworkReport {
        // A UTF-8 byte order mark (Excel's "CSV UTF-8", a JSON report saved by some
        // editors) is not part of the text; UTF-16 is another encoding, refused by name.
        // (Removed in place: a caller that hands over its last use keeps no second copy.)
        var bytes = consume file
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes.removeFirst(3) }
        if bytes.starts(with: [0xFF, 0xFE]) || bytes.starts(with: [0xFE, 0xFF]) {
            throw FieldError("file", "is UTF-16 (as Excel's \"Unicode Text\" saves it), not UTF-8: save it as \"CSV UTF-8\" (or export it again from the network) and import that")
        }
        if bytes.prefix(2).contains(0) {
            throw FieldError("file", "starts with NUL bytes: it is UTF-16 without its mark, or not text at all; save it as \"CSV UTF-8\" and import that")
        }
        guard bytes.count <= maxBytes else { throw FieldError("file", "is \(bytes.count) bytes; a network report may have at most \(maxBytes) (split it by month)") }
        if let zone, !ReportQuery.isZone(zone) { throw FieldError("timezone", "\"\(zone)\" is not an IANA time zone (e.g. UTC, America/Los_Angeles)") }
        // A report is read whole: what it holds bounds the memory that takes. JSON by its
        // objects and members (a file of empty objects, or one object of a million keys,
        // is refused before it is decoded); CSV by its lines (counted as read) and their
        // length (a line of a million commas would be a million fields).
        var objects = 0, members = 0, line = 0, longest = 0, newlines = 0
        let isJSON = NetworkReportParsers.startsJSON(bytes)
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "{"): objects += 1
            case UInt8(ascii: ":"): members += 1
            case 0x0A:
                longest = max(longest, line)
                line = 0
                newlines += 1
                // A CSV is refused at its first line over the limit (the header and a last
                // empty line aside), before any of it is read.
                if !isJSON, newlines > maxLines + 1 {
                    throw FieldError("file", "has more than \(maxLines) lines, blank ones included (split it by month)")
                }
                continue
            default: break
            }
            line += 1
        }
        longest = max(longest, line)
        if isJSON {
            guard objects <= maxJSONObjects, members <= maxJSONMembers else {
                throw FieldError("file", "has more than \(maxJSONObjects) JSON objects or \(maxJSONMembers) members (split it by month)")
            }
        } else if longest > maxLineBytes {
            throw FieldError("file", "has a line longer than \(maxLineBytes) bytes")
        } else {
            // Europe's spreadsheets write CSV with semicolons, "Unicode Text" with tabs.
            let header = String(decoding: bytes.prefix { $0 != 0x0A }, as: UTF8.self)
            if !header.contains(",") {
                for (separator, name) in [(";", "semicolons"), ("\t", "tabs")] where header.contains(separator) {
                    throw FieldError("header", "is separated by \(name) (\"\(Self.excerpt(header))\"); AdTally reads comma-separated files: export the report again as CSV with commas")
                }
            }
        }
        var report: NetworkReport
        switch source {
        // Lines reserved at once: an array grown by doubling would hold both its old and its
        // new storage (a third more) at the last growth.
        case .csv: report = try NetworkReportParsers.csv(bytes, zone: zone, capacity: newlines)
        // The networks' CSV: their dashboards' exports (what most publishers download), MAX's API CSV.
        case _ where !isJSON: report = try NetworkCSVExports.read(bytes, source: source, zone: zone, capacity: newlines)
        case .admob: report = try NetworkReportParsers.admob(bytes)
        case .max: report = try NetworkReportParsers.max(bytes)
        case .levelplay: report = try NetworkReportParsers.levelplay(bytes)
        }
        if let zone { report.zone = zone }
        guard report.lines.count <= maxLines else { throw FieldError("file", "has \(report.lines.count) lines; at most \(maxLines) (split it by month)") }
        // An import that recognises nothing is a wrong file (another source's, a header
        // alone), not an empty day: a file that states its range (AdMob's) may be empty.
        if !fromAPI, report.lines.isEmpty, !report.hasRange, report.leftOut.keys.allSatisfy({ $0 == "totals line" }) {
            let begins = String(decoding: bytes.prefix { $0 != 0x0A }, as: UTF8.self)
            throw FieldError("file", "has no line of \(source.expectedShape); it begins \"\(Self.excerpt(begins))\"")
        }
        // A CSV line written twice, byte for byte, is a file pasted twice (or a copy's lines
        // appended), which would double the network's side. Lines that differ only in
        // columns AdTally does not read (ad units, placements) are a finer breakdown,
        // summed later as before.
        if !isJSON { try Self.refuseRepeatedLines(bytes) }
        // A day that has not begun in the file's own zone is a typo (2099 for 2019), not data.
        if let today = try? ReportQuery.today(in: report.zone, now: now), let late = report.lines.first(where: { $0.day > today + 1 }) {
            throw FieldError("\(late.position): day", "is \(ReportQuery.formatDate(late.day)), after tomorrow in \(report.zone): a network reports days that have begun")
        }
        return report
    }
}

extension NetworkReport {
    /// Refuses a CSV line (the header aside) that repeats an earlier one byte for byte,
    /// naming both. Only each line's hash is kept (8 bytes a line); the bytes are compared
    /// when a hash comes again, by finding the earlier line with it.
    static func refuseRepeatedLines(_ bytes: [UInt8]) throws(FieldError) {
        func lines(_ body: (Int, Range<Int>) throws(FieldError) -> Bool) throws(FieldError) {
            var start = 0, number = 0
            while start <= bytes.count {
                let end = bytes[start...].firstIndex(of: 0x0A) ?? bytes.count
                number += 1
                var range = start..<end
                if range.count > 0, bytes[range.upperBound - 1] == 0x0D { range = range.lowerBound..<(range.upperBound - 1) }
                start = end + 1
                // The header, and lines of nothing but separators and blanks, are not data.
                guard number > 1, bytes[range].contains(where: { $0 != 0x20 && $0 != 0x09 && $0 != 0x2C }) else { continue }
                guard try body(number, range) else { return }
            }
        }
        func hash(_ range: Range<Int>) -> Int {
            var hasher = Hasher()
            bytes.withUnsafeBytes { hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: $0[range])) }
            return hasher.finalize()
        }
        var seen = Set<Int>()
        try lines { (number, range) throws(FieldError) in
            guard seen.insert(hash(range)).inserted else {
                // The earlier line with these bytes, if any (else two lines' hashes agreed).
                var earlier: Int?
                try lines { (other, otherRange) throws(FieldError) in
                    guard other < number else { return false }
                    if bytes[otherRange].elementsEqual(bytes[range]) { earlier = other }
                    return earlier == nil
                }
                if let earlier {
                    throw FieldError("line \(number)", "repeats line \(earlier) byte for byte (a file pasted twice would double the network's side); remove one")
                }
                return true
            }
            return true
        }
    }

    /// The first 120 characters of a line, printable, for an error that says what it saw.
    static func excerpt(_ text: String) -> String {
        String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F && $0 != "\"" }.prefix(120)).replacingOccurrences(of: "\t", with: "\\t")
    }

    /// A network's name for an app or an ad source, checked as an import checks it
    /// (no formula, no control characters, at most 200 bytes): for mappings.
    public static func externalName(_ text: String, field: String) throws(FieldError) -> String {
        try NetworkReportValues.name(text, field)
    }
}

/// The rules every source's values follow, one place for all of them.
enum NetworkReportValues {
    /// Most impressions or clicks on one line.
    static let maxCount: Int64 = 1_000_000_000_000
    /// Most earnings on one line: below 10^12 units.
    static let maxRevenueDigits = 12

    static let countRule = "must be a whole number from 0 to 10^12"
    static let revenueRule = "must be a decimal amount ≥ 0 below 10^12 (at most 12 decimals; rounded half up to 6)"

    /// A count written as digits (a JSON integer may come as a string, as AdMob's int64s do).
    static func count(_ text: String, _ field: String) throws(FieldError) -> Int64 {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        // "1234.0" is how some exports write a whole number.
        let whole = trimmed.hasSuffix(".0") ? String(trimmed.dropLast(2)) : trimmed
        guard !whole.isEmpty, whole.utf8.count <= 13, whole.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
              let value = Int64(whole), value <= maxCount else { throw FieldError(field, countRule) }
        return value
    }

    /// Micros written as a whole number (AdMob's `microsValue`): below 10^12 units, as every amount.
    static func microsCount(_ text: String, _ field: String) throws(FieldError) -> Int64 {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty, trimmed.utf8.count <= 18, trimmed.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let value = Int64(trimmed) else {
            throw FieldError(field, "must be a whole number of micros ≥ 0 below 10^18 (10^12 units)")
        }
        return value
    }

    /// A decimal amount as micros, rounded half up beyond the sixth decimal (networks
    /// write up to 10; AdMob's micros are exact already). Scientific notation (1e-05, as
    /// a JSON number may be written) is read too.
    static func micros(_ text: String, _ field: String) throws(FieldError) -> Int64 {
        var written = text.trimmingCharacters(in: .whitespaces)
        if let e = written.firstIndex(where: { $0 == "e" || $0 == "E" }) {
            guard let exponent = Int(written[written.index(after: e)...]), (-20...20).contains(exponent) else { throw FieldError(field, revenueRule) }
            written = shifted(String(written[..<e]), by: exponent) ?? "x"
        }
        let parts = written.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let whole = parts.first, !whole.isEmpty, whole.count <= maxRevenueDigits,
              whole.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { throw FieldError(field, revenueRule) }
        let fraction = parts.count == 2 ? Array(parts[1].utf8) : []
        guard fraction.count <= 12, fraction.allSatisfy({ (0x30...0x39).contains($0) }), parts.count == 1 || !fraction.isEmpty else {
            throw FieldError(field, revenueRule)
        }
        var micros = Int64(whole)! * 1_000_000
        var place: Int64 = 100_000
        for digit in fraction.prefix(6) {
            micros += Int64(digit - 0x30) * place
            place /= 10
        }
        if fraction.count > 6, fraction[6] >= 0x35 { micros += 1 }
        return micros
    }

    /// `mantissa` × 10^exponent as plain decimal text, or nil.
    private static func shifted(_ mantissa: String, by exponent: Int) -> String? {
        let parts = mantissa.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), !parts[0].isEmpty else { return nil }
        var digits = String(parts[0]) + (parts.count == 2 ? String(parts[1]) : "")
        var point = parts[0].count + exponent
        guard digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        if point <= 0 {
            digits = String(repeating: "0", count: 1 - point) + digits
            point = 1
        }
        if point >= digits.count { return digits + String(repeating: "0", count: point - digits.count) }
        return String(digits.prefix(point)) + "." + String(digits.dropFirst(point))
    }

    /// A name the network wrote (an app id, a network): refused when a spreadsheet would
    /// run it as a formula, when it holds control characters, or when it is too long.
    static func name(_ text: String, _ field: String) throws(FieldError) -> String {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty else { throw FieldError(field, "must not be empty") }
        guard trimmed.utf8.count <= 200 else { throw FieldError(field, "must be at most 200 bytes") }
        if ReportText.startsLikeFormula(text) {
            throw FieldError(field, "\"\(trimmed.prefix(40))\" starts like a spreadsheet formula (= + - @): a formula cell is refused")
        }
        guard !trimmed.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw FieldError(field, "must not contain control characters")
        }
        return trimmed
    }

    /// A country as the networks write it ("US", "us"); nil for the ones they use for
    /// unknown ("ZZ", "XX", "--", "", "unknown").
    static func country(_ text: String, _ field: String) throws(FieldError) -> String? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if ["", "ZZ", "zz", "XX", "xx", "--", "unknown", "Unknown", "UNKNOWN", "(unknown)"].contains(trimmed) { return nil }
        guard let code = EventValidator.countryCode(trimmed) else {
            throw FieldError(field, "\"\(trimmed.prefix(40))\" is not an ISO 3166-1 alpha-2 country code (US, JP; ZZ or empty for unknown)")
        }
        return code
    }

    /// A date written `YYYY-MM-DD` or (AdMob's) `YYYYMMDD`.
    static func day(_ text: String, _ field: String) throws(FieldError) -> Int {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        var dashed = trimmed
        if trimmed.utf8.count == 8, trimmed.utf8.allSatisfy({ (0x30...0x39).contains($0) }) {
            let year = trimmed.prefix(4), month = trimmed.dropFirst(4).prefix(2), day = trimmed.suffix(2)
            dashed = "\(year)-\(month)-\(day)"
        }
        guard let value = ReportQuery.parseDate(dashed) else { throw FieldError(field, "must be a date, YYYY-MM-DD") }
        return value
    }

    /// A currency code.
    static func currency(_ text: String, _ field: String) throws(FieldError) -> String {
        guard let code = ISOCodes.currency(text.trimmingCharacters(in: .whitespaces)) else {
            throw FieldError(field, "must be an ISO 4217 code (USD, EUR, JPY)")
        }
        return code
    }
}

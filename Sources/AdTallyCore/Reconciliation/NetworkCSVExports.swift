import Foundation

/// The networks' CSV files (DESIGN §11): what their dashboards export — AdMob's report
/// "Export → CSV", MAX's Analytics export, LevelPlay's reporting export — and MAX's
/// `maxReport` CSV, read by the names their headers use ("Estimated earnings (USD)",
/// "Package Name", "estimated_revenue", "Ad Source", "Revenue ($)").
///
/// A header is matched by its letters and digits only, in any case ("Ad format",
/// "ad_format", "AD FORMAT" are one column); a currency in parentheses (`(USD)`, `($)`,
/// `(€)`) is the file's currency. Values are read as the dashboards write them:
/// country names ("United States") or codes, counts with thousands separators
/// ("1,234"), amounts with a currency sign ("$1,234.56"), dates `YYYY-MM-DD`,
/// `YYYYMMDD` or with the month's name ("Nov 1, 2026"); the totals line a dashboard
/// appends is left out and counted. Read a record at a time: a file's lines are turned
/// into report lines as they come, never all held as text first.
enum NetworkCSVExports {
    /// What one column is for.
    enum Field: String, CaseIterable {
        case day, app, platform, network, format, country, impressions, clicks, revenue, currency, timezone
    }

    /// Each field's header names, by source, most specific first (the first present wins).
    static func names(_ field: Field, source: NetworkReportSource) -> [String] {
        switch (field, source) {
        case (.day, _): ["date", "day"]
        case (.app, .admob): ["appid", "app", "appname"]
        case (.app, .max): ["packagename", "package", "bundleid", "application", "app"]
        case (.app, _): ["appkey", "app", "appname"]
        case (.platform, .admob): []
        case (.platform, _): ["platform", "os"]
        case (.network, .admob): ["adsource", "adnetwork", "network"]
        case (.network, _): ["network", "adsource", "adnetwork", "providername", "provider"]
        case (.format, .levelplay): ["adformat", "adunit", "adunits", "format"]
        case (.format, _): ["adformat", "format", "adtype"]
        case (.country, _): ["countrycode", "country", "countryname", "countryorregion", "region"]
        case (.impressions, _): ["impressions", "adimpressions", "impr"]
        case (.clicks, _): ["clicks", "adclicks"]
        case (.revenue, _): ["estimatedearnings", "estimatedrevenue", "estrevenue", "earnings", "revenue", "netrevenue"]
        case (.currency, _): ["currency", "currencycode"]
        case (.timezone, _): ["timezone", "zone", "reportingtimezone"]
        }
    }

    /// The fields a file must have, by source (AdMob's network report has no ad source:
    /// its lines are AdMob's own).
    static func required(_ source: NetworkReportSource) -> [Field] {
        source == .admob ? [.day, .app, .format, .impressions, .revenue] : [.day, .app, .network, .format, .impressions, .revenue]
    }

    /// A header cell as matched: its letters and digits, lower-cased, without what is in
    /// parentheses; and the currency the parentheses name, if any.
    static func headerKey(_ cell: String) -> (key: String, currency: String?) {
        var key = "", inside = "", depth = 0
        var currency: String?
        for scalar in cell.unicodeScalars {
            if scalar == "(" { depth += 1; inside = ""; continue }
            if scalar == ")" {
                depth = max(0, depth - 1)
                currency = currency ?? Self.currency(named: inside.trimmingCharacters(in: .whitespaces))
                continue
            }
            if depth > 0 { inside.unicodeScalars.append(scalar); continue }
            if scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) { key.unicodeScalars.append(scalar) }
        }
        return (key.lowercased(), currency)
    }

    /// A currency a header or an amount writes as a code or a sign.
    static func currency(named text: String) -> String? {
        if let code = ISOCodes.currency(text) { return code }
        switch text {
        case "$", "US$", "USD$": return "USD"
        case "€": return "EUR"
        case "£": return "GBP"
        case "¥", "JP¥", "円": return "JPY"
        case "₩": return "KRW"
        case "₹": return "INR"
        default: return nil
        }
    }

    /// Reads a network's CSV export. `zone` is the zone asked for (the file's own, when it
    /// states one, must agree with it).
    static func read(_ bytes: [UInt8], source: NetworkReportSource, zone asked: String?, capacity: Int = 0) throws(FieldError) -> NetworkReport {
        var columns: [Field: Int] = [:]
        var headerCurrency: String?
        var headerText = ""
        var lines: [NetworkReportLine] = []
        lines.reserveCapacity(capacity)
        var leftOut: [String: Int] = [:]
        var fileZone: String?
        var table = NameTable()

        func header(_ record: CSVRecordReader.Record) throws(FieldError) {
            headerText = record.fields.joined(separator: ",")
            let keys = record.fields.map(headerKey)
            var seen = Set<String>()
            for (key, _) in keys where !key.isEmpty && !seen.insert(key).inserted {
                throw FieldError("header", "names \(key.prefix(40)) twice")
            }
            for field in Field.allCases {
                for name in names(field, source: source) {
                    if let index = keys.firstIndex(where: { $0.key == name }) {
                        columns[field] = index
                        if field == .revenue { headerCurrency = keys[index].currency }
                        break
                    }
                }
            }
            for field in required(source) where columns[field] == nil {
                throw FieldError(
                    "header",
                    "has no \(field.rawValue) column (a header named \(names(field, source: source).joined(separator: ", ")), in any case and spacing); "
                        + "it reads \"\(NetworkReport.excerpt(headerText))\". AdTally takes \(source.expectedShape)"
                )
            }
        }

        func line(_ record: CSVRecordReader.Record) throws(FieldError) {
            let position = "line \(record.line)"
            func cell(_ field: Field) -> String? {
                guard let index = columns[field], index < record.fields.count else { return nil }
                return record.fields[index].trimmingCharacters(in: .whitespaces)
            }
            let dayText = cell(.day) ?? ""
            // A dashboard's totals line: its day cell says "Total", or it is empty and so is
            // the format cell while some cell says "Total". (An app called "Total Battle"
            // has its days and formats.)
            let lowerDay = dayText.lowercased()
            let says = record.fields.contains { $0.trimmingCharacters(in: .whitespaces).lowercased().hasPrefix("total") }
            if lowerDay.hasPrefix("total") || lowerDay.hasPrefix("grand total")
                || (dayText.isEmpty && (cell(.format) ?? "").isEmpty && says) {
                leftOut["totals line", default: 0] += 1
                return
            }
            let formatText = cell(.format) ?? ""
            guard let format = FormatVocabulary.export(formatText) else {
                if FormatVocabulary.isOfferwall(formatText) {
                    leftOut["offerwall", default: 0] += 1
                    return
                }
                throw FieldError("\(position): format", "\"\(formatText.prefix(40))\" is not an ad format AdTally knows (\(FormatVocabulary.exportNames))")
            }
            var app = table.intern(try NetworkReportValues.name(cell(.app) ?? "", "\(position): app"))
            if source == .max, let platform = cell(.platform)?.lowercased(), !platform.isEmpty {
                // The same package name on iOS and Android is two apps: "android/com.example.game".
                app = table.intern("\(platform)/\(app)")
            }
            let network = try cell(.network).map { text throws(FieldError) in table.intern(try NetworkReportValues.name(text, "\(position): network")) } ?? "admob"
            if let written = cell(.timezone), !written.isEmpty {
                guard ReportQuery.isZone(written) else { throw FieldError("\(position): timezone", "\"\(written.prefix(40))\" is not an IANA time zone") }
                guard fileZone == nil || fileZone == written else {
                    throw FieldError("\(position): timezone", "is \(written), an earlier line's is \(fileZone!): one file is in one zone")
                }
                fileZone = written
            }
            let revenueText = cell(.revenue) ?? ""
            let (revenue, sign) = try Self.amount(revenueText, "\(position): revenue")
            var currency = headerCurrency ?? sign
            if let written = cell(.currency), !written.isEmpty { currency = try NetworkReportValues.currency(written, "\(position): currency") }
            if currency == nil, source == .max || source == .levelplay { currency = "USD" }
            guard let currency else {
                throw FieldError("\(position): revenue", "names no currency (the header's \"(USD)\", a currency column or a sign such as $): export the report with its currency shown")
            }
            lines.append(NetworkReportLine(
                position: position, day: try Self.day(dayText, "\(position): day"), app: app, network: network, format: format,
                country: try cell(.country).flatMap { text throws(FieldError) in try CountryNames.code(text, "\(position): country") },
                impressions: try Self.count(cell(.impressions) ?? "", "\(position): impressions"),
                clicks: try cell(.clicks).flatMap { text throws(FieldError) in text.isEmpty ? nil : try Self.count(text, "\(position): clicks") },
                revenueMicros: revenue, currency: currency
            ))
        }

        var records = 0
        try NetworkReportParsers.forEachRecord(bytes) { (record) throws(FieldError) in
            if columns.isEmpty { return try header(record) }
            // Refused at the first line over the limit, before it is read.
            records += 1
            guard records <= NetworkReport.maxLines else { throw FieldError("file", "has more than \(NetworkReport.maxLines) lines (split it by month)") }
            try line(record)
        }
        guard !columns.isEmpty else { throw FieldError("file", "is empty; it starts with a header line") }
        if let asked, let fileZone, asked != fileZone {
            throw FieldError("timezone", "the file says \(fileZone) and the import was asked for \(asked)")
        }
        return NetworkReport(source: source, zone: fileZone ?? asked ?? source.defaultZone, lines: lines, leftOut: leftOut)
    }

    /// One buffer per distinct name: half a million lines name a few apps and networks.
    struct NameTable {
        var known: [String: String] = [:]
        mutating func intern(_ name: String) -> String {
            if let stored = known[name] { return stored }
            known[name] = name
            return name
        }
    }

    /// A count as dashboards write it: "1,234", "1 234", "1234".
    static func count(_ text: String, _ field: String) throws(FieldError) -> Int64 {
        let grouped = text.trimmingCharacters(in: .whitespaces)
        let plain = try ungrouped(grouped, field, rule: NetworkReportValues.countRule)
        return try NetworkReportValues.count(plain, field)
    }

    /// An amount as dashboards write it ("$1,234.56", "US$0.12", "1234.5", "€3.10"), as
    /// micros, with the currency its sign names.
    static func amount(_ text: String, _ field: String) throws(FieldError) -> (micros: Int64, currency: String?) {
        var written = text.trimmingCharacters(in: .whitespaces)
        var currency: String?
        let sign = String(written.prefix { !($0.isASCII && ($0.isNumber || $0 == "." || $0 == "-")) }).trimmingCharacters(in: .whitespaces)
        if !sign.isEmpty {
            guard let named = Self.currency(named: sign) else { throw FieldError(field, NetworkReportValues.revenueRule) }
            currency = named
            written = String(written.dropFirst(written.prefix { !($0.isASCII && ($0.isNumber || $0 == "." || $0 == "-")) }.count))
        }
        // A decimal comma (1.234,56, 0,25 or 0,125) is another convention: refused by name.
        let groups = written.split(separator: ",", omittingEmptySubsequences: false)
        if written.contains(","), !written.contains("."),
           groups.last.map({ $0.count != 3 }) ?? false || groups.first.map({ $0 == "0" || $0.hasPrefix("0") }) ?? false {
            throw FieldError(field, "\"\(text.prefix(40))\" has a decimal comma; export the report with a decimal point (an English locale)")
        }
        let plain = try ungrouped(written, field, rule: NetworkReportValues.revenueRule)
        return (try NetworkReportValues.micros(plain, field), currency)
    }

    /// A number without its thousands separators (, or space), checked to be groups of three.
    static func ungrouped(_ text: String, _ field: String, rule: String) throws(FieldError) -> String {
        guard text.contains(",") || text.contains(" ") || text.contains("\u{A0}") else { return text }
        let whole = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        let groups = whole[0].split(omittingEmptySubsequences: false, whereSeparator: { $0 == "," || $0 == " " || $0 == "\u{A0}" })
        guard groups.count > 1, (1...3).contains(groups[0].count), groups.dropFirst().allSatisfy({ $0.count == 3 }) else {
            throw FieldError(field, rule)
        }
        return groups.joined() + (whole.count == 2 ? "." + whole[1] : "")
    }

    static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]

    /// A day as dashboards write it: `2026-11-01`, `20261101`, `Nov 1, 2026`, `1 Nov 2026`,
    /// `November 1, 2026`. A slashed date (11/01/2026) is refused: it is November 1 in
    /// one locale and January 11 in another.
    static func day(_ text: String, _ field: String) throws(FieldError) -> Int {
        if text.contains("/") {
            throw FieldError(field, "\"\(text.prefix(40))\" could be either month-first or day-first; export dates as YYYY-MM-DD (or with the month's name)")
        }
        let words = text.lowercased().split(whereSeparator: { $0 == " " || $0 == "," }).map(String.init)
        if words.count == 3 {
            var month: Int?, day: Int?, year: Int?
            for word in words {
                if let index = months.firstIndex(where: { word.hasPrefix($0) }) {
                    month = index + 1
                } else if let number = Int(word) {
                    if number > 31 { year = number } else { day = number }
                }
            }
            if let month, let day, let year {
                return try NetworkReportValues.day(String(format: "%04d-%02d-%02d", year, month, day), field)
            }
        }
        return try NetworkReportValues.day(text, field)
    }
}

extension FormatVocabulary {
    static let exportNames = "Banner, MREC, Leaderboard, Interstitial, App open, Rewarded, Rewarded interstitial, Rewarded video, Native, Native advanced (Offerwall is left out)"

    /// A format as the networks' dashboards and APIs name it, in any case and spacing.
    static func export(_ text: String) -> AdFormat? {
        switch text.lowercased().filter({ $0.isLetter }) {
        case "banner", "banners", "mrec", "leader", "leaderboard", "adaptivebanner", "mediumrectangle": .banner
        case "interstitial", "inter", "appopen", "appopenad", "fullscreen": .interstitial
        case "native", "nativead", "nativeads", "nativeadvanced", "nativebanner": .native
        case "rewarded", "reward", "rewardedvideo", "rewardedinterstitial", "rewardedinter", "rewardedad", "video": .rewarded
        default: nil
        }
    }
}

/// Countries as dashboards name them ("United States", "South Korea", "Türkiye"), by
/// the English names of the ISO 3166-1 codes and the older names still in use; codes
/// are read as codes.
enum CountryNames {
    static let byName: [String: String] = {
        var names: [String: String] = [:]
        let english = Locale(identifier: "en_US")
        for code in ISOCodes.countries where code != "ZZ" {
            if let name = english.localizedString(forRegionCode: code) { names[key(name)] = code }
        }
        let older: [String: String] = [
            "Turkey": "TR", "Czech Republic": "CZ", "Korea": "KR", "Republic of Korea": "KR", "Korea, Republic of": "KR",
            "Russian Federation": "RU", "Ivory Coast": "CI", "Cote d'Ivoire": "CI", "Burma": "MM", "Macau": "MO", "Viet Nam": "VN",
            "United States of America": "US", "USA": "US", "UK": "GB", "Great Britain": "GB", "UAE": "AE", "Hong Kong SAR": "HK",
            "Macao SAR": "MO", "Taiwan, Province of China": "TW", "Democratic Republic of the Congo": "CD", "Republic of the Congo": "CG",
            "Congo": "CG", "Iran, Islamic Republic of": "IR", "Swaziland": "SZ", "Macedonia": "MK", "Cape Verde": "CV",
            "Palestine": "PS", "Palestinian Territories": "PS", "Vatican City": "VA", "Holy See": "VA", "Kosovo": "XK",
            "Moldova, Republic of": "MD", "Tanzania, United Republic of": "TZ", "Venezuela, Bolivarian Republic of": "VE",
            "Bolivia, Plurinational State of": "BO", "Lao People's Democratic Republic": "LA", "Syrian Arab Republic": "SY",
        ]
        for (name, code) in older { names[key(name)] = code }
        return names
    }()

    /// A name as matched: letters only, lower-cased, accents folded.
    static func key(_ name: String) -> String {
        name.folding(options: [.diacriticInsensitive, .caseInsensitive], locale: nil).lowercased().filter { $0.isLetter }
    }

    /// The code of a country a file names; nil where it says unknown.
    static func code(_ text: String, _ field: String) throws(FieldError) -> String? {
        let lower = text.lowercased()
        if ["", "--", "other", "others"].contains(lower) || lower.hasPrefix("unknown") || lower.hasPrefix("(unknown") { return nil }
        if text.utf8.count == 2 { return try NetworkReportValues.country(text, field) }
        guard let code = byName[key(text)] else {
            throw FieldError(field, "\"\(text.prefix(40))\" is neither an ISO 3166-1 alpha-2 code nor a country name AdTally knows; export the report with country codes")
        }
        return code
    }
}

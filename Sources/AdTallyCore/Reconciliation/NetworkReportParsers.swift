import Foundation

/// The readers of each network's report shape (DESIGN §11). Each keeps the network's
/// own names (mapped later) and refuses the whole file at its first bad line, naming it.
enum NetworkReportParsers {
    // MARK: - AdMob

    /// AdMob API `networkReport:generate` and `mediationReport:generate`: a JSON array
    /// of messages, the first a `header` (date range, currency, reporting zone), then
    /// `row`s (`dimensionValues` DATE, APP, FORMAT, COUNTRY and, in a mediation report,
    /// AD_SOURCE; `metricValues` IMPRESSIONS, CLICKS as `integerValue`, ESTIMATED_EARNINGS
    /// as `microsValue`), the last a `footer` (`warnings`, `matchingRowCount`).
    static func admob(_ bytes: [UInt8]) throws(FieldError) -> NetworkReport {
        struct Day: Decodable { var year: Int; var month: Int; var day: Int }
        struct DateRange: Decodable { var startDate: Day?; var endDate: Day? }
        struct Localization: Decodable { var currencyCode: String? }
        struct Header: Decodable { var dateRange: DateRange?; var localizationSettings: Localization?; var reportingTimeZone: String? }
        struct Dimension: Decodable { var value: String?; var displayLabel: String? }
        struct Metric: Decodable { var integerValue: JSONScalar?; var microsValue: JSONScalar?; var doubleValue: JSONScalar? }
        struct Row: Decodable { var dimensionValues: [String: Dimension]?; var metricValues: [String: Metric]? }
        struct Warning: Decodable { var type: String?; var description: String? }
        struct Footer: Decodable { var warnings: [Warning]?; var matchingRowCount: JSONScalar? }
        struct Message: Decodable { var header: Header?; var row: Row?; var footer: Footer? }

        let messages: [Message]
        do {
            messages = try JSONDecoder().decode([Message].self, from: Data(bytes))
        } catch {
            throw FieldError("file", "is not an AdMob report (a JSON array of header, row and footer messages): \(Self.brief(error))")
        }
        guard let header = messages.first?.header else { throw FieldError("file", "an AdMob report starts with its header message") }
        let currency = try NetworkReportValues.currency(header.localizationSettings?.currencyCode ?? "", "header.localizationSettings.currencyCode")
        var zone = NetworkReportSource.admob.defaultZone
        if let written = header.reportingTimeZone {
            guard ReportQuery.isZone(written) else { throw FieldError("header.reportingTimeZone", "\"\(written.prefix(40))\" is not an IANA time zone") }
            zone = written
        }
        func day(_ value: Day?, _ field: String) throws(FieldError) -> Int? {
            guard let value else { return nil }
            let text = "\(value.year)-\(value.month < 10 ? "0" : "")\(value.month)-\(value.day < 10 ? "0" : "")\(value.day)"
            return try NetworkReportValues.day(text, field)
        }
        let firstDay = try day(header.dateRange?.startDate, "header.dateRange.startDate")
        let lastDay = try day(header.dateRange?.endDate, "header.dateRange.endDate")
        if let firstDay, let lastDay, firstDay > lastDay {
            throw FieldError("header.dateRange", "ends (\(ReportQuery.formatDate(lastDay))) before it starts (\(ReportQuery.formatDate(firstDay)))")
        }

        var lines: [NetworkReportLine] = []
        var warnings: [String] = []
        var isDelayed = false
        var sawFooter = false
        var rowNumber = 0
        for message in messages.dropFirst() {
            if let footer = message.footer {
                sawFooter = true
                for warning in footer.warnings ?? [] {
                    let type = warning.type ?? "OTHER"
                    if type == "DATA_DELAYED" { isDelayed = true }
                    warnings.append(type + (warning.description.map { ": \($0.prefix(500))" } ?? ""))
                }
                continue
            }
            guard let row = message.row else { continue }
            rowNumber += 1
            let position = "row \(rowNumber)"
            let dimensions = row.dimensionValues ?? [:], metrics = row.metricValues ?? [:]
            func dimension(_ name: String, required: Bool = true) throws(FieldError) -> Dimension? {
                guard let value = dimensions[name], value.value != nil else {
                    if required { throw FieldError("\(position): dimensionValues.\(name)", "is missing; generate the report with the DATE, APP and FORMAT dimensions") }
                    return nil
                }
                return value
            }
            func integer(_ name: String, required: Bool) throws(FieldError) -> Int64? {
                guard let metric = metrics[name] else {
                    if required { throw FieldError("\(position): metricValues.\(name)", "is missing; generate the report with the IMPRESSIONS and ESTIMATED_EARNINGS metrics") }
                    return nil
                }
                return try NetworkReportValues.count(metric.integerValue?.text ?? "", "\(position): metricValues.\(name).integerValue")
            }
            let date = try NetworkReportValues.day(try dimension("DATE")!.value!, "\(position): dimensionValues.DATE")
            if let firstDay, let lastDay, !(firstDay...lastDay).contains(date) {
                throw FieldError("\(position): dimensionValues.DATE", "\(ReportQuery.formatDate(date)) is outside the header's dateRange, \(ReportQuery.formatDate(firstDay)) to \(ReportQuery.formatDate(lastDay))")
            }
            let app = try NetworkReportValues.name(try dimension("APP")!.value!, "\(position): dimensionValues.APP")
            let formatText = try dimension("FORMAT")!.value!
            guard let format = FormatVocabulary.admob(formatText) else {
                throw FieldError("\(position): dimensionValues.FORMAT", "\"\(formatText.prefix(40))\" is not an AdMob format (\(FormatVocabulary.admobNames))")
            }
            // A mediation report names each ad source; a network report is AdMob's own.
            var network = "admob"
            if let source = try dimension("AD_SOURCE", required: false) {
                network = try NetworkReportValues.name(source.displayLabel ?? source.value!, "\(position): dimensionValues.AD_SOURCE")
            }
            let country = try dimension("COUNTRY", required: false).flatMap { value throws(FieldError) in
                try NetworkReportValues.country(value.value!, "\(position): dimensionValues.COUNTRY")
            }
            guard let earnings = metrics["ESTIMATED_EARNINGS"] else {
                throw FieldError("\(position): metricValues.ESTIMATED_EARNINGS", "is missing; generate the report with the IMPRESSIONS and ESTIMATED_EARNINGS metrics")
            }
            let micros: Int64
            if let text = earnings.microsValue?.text {
                micros = try NetworkReportValues.microsCount(text, "\(position): metricValues.ESTIMATED_EARNINGS.microsValue")
            } else {
                micros = try NetworkReportValues.micros(earnings.doubleValue?.text ?? "", "\(position): metricValues.ESTIMATED_EARNINGS")
            }
            lines.append(NetworkReportLine(
                position: position, day: date, app: app, network: network, format: format, country: country,
                impressions: try integer("IMPRESSIONS", required: true)!, clicks: try integer("CLICKS", required: false),
                revenueMicros: micros, currency: currency
            ))
        }
        // A stream cut short (a failed pull, a truncated download) has no footer.
        guard sawFooter else { throw FieldError("file", "has no footer message: the AdMob report is incomplete") }
        return NetworkReport(source: .admob, zone: zone, lines: lines, warnings: warnings, isDelayed: isDelayed, firstDay: firstDay, lastDay: lastDay)
    }

    // MARK: - MAX

    /// AppLovin MAX `maxReport` as JSON `{"code": 200, "results": [{…}]}` (its CSV: NetworkCSVExports);
    /// columns `day, application, package_name, platform, network, ad_format, country,
    /// impressions, estimated_revenue` (more are allowed and ignored). Days in UTC, USD.
    static func max(_ bytes: [UInt8]) throws(FieldError) -> NetworkReport {
        var records: [(position: String, fields: [String: String])] = []
        // CSV (the API's, the dashboard's export) is read by NetworkCSVExports.
        do {
            struct Body: Decodable { var code: JSONScalar?; var results: [[String: JSONScalar]]? }
            let body: Body
            do { body = try JSONDecoder().decode(Body.self, from: Data(bytes)) } catch {
                throw FieldError("file", "is not a MAX report (JSON with results): \(Self.brief(error))")
            }
            if let code = body.code?.text, code != "200" { throw FieldError("code", "is \(code.prefix(10)): the MAX report is an error, not data") }
            guard let results = body.results else { throw FieldError("results", "is missing") }
            for (index, result) in results.enumerated() {
                records.append(("results[\(index)]", result.compactMapValues(\.text)))
            }
        }
        var lines: [NetworkReportLine] = []
        for record in records {
            func field(_ name: String, or other: String? = nil) throws(FieldError) -> String {
                if let value = record.fields[name] ?? other.flatMap({ record.fields[$0] }) { return value }
                throw FieldError("\(record.position): \(name)", "is missing; the MAX report needs day, package_name, network, ad_format, country, impressions, estimated_revenue")
            }
            let position = record.position
            let package = try NetworkReportValues.name(try field("package_name", or: "application"), "\(position): package_name")
            // The same package name on iOS and Android is two apps: "android/com.example.game".
            let platform = record.fields["platform"].map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.flatMap { $0.isEmpty ? nil : $0 }
            let app = platform.map { "\($0)/\(package)" } ?? package
            let formatText = try field("ad_format")
            guard let format = FormatVocabulary.max(formatText) else {
                throw FieldError("\(position): ad_format", "\"\(formatText.prefix(40))\" is not a MAX ad format (\(FormatVocabulary.maxNames))")
            }
            lines.append(NetworkReportLine(
                position: position, day: try NetworkReportValues.day(try field("day", or: "date"), "\(position): day"), app: app,
                network: try NetworkReportValues.name(try field("network"), "\(position): network"), format: format,
                country: try NetworkReportValues.country(try field("country"), "\(position): country"),
                impressions: try NetworkReportValues.count(try field("impressions"), "\(position): impressions"),
                clicks: try record.fields["clicks"].map { text throws(FieldError) in try NetworkReportValues.count(text, "\(position): clicks") },
                revenueMicros: try NetworkReportValues.micros(try field("estimated_revenue", or: "revenue"), "\(position): estimated_revenue"),
                currency: "USD"
            ))
        }
        return NetworkReport(source: .max, zone: NetworkReportSource.max.defaultZone, lines: lines)
    }

    // MARK: - LevelPlay

    /// LevelPlay's reporting API: a JSON array of rows, each `date, appKey, adFormat,
    /// adNetwork, countryCode, impressions, clicks, revenue` (the current API), or an
    /// earlier version's `date, appKey, adUnits, data: [{providerName, countryCode,
    /// impressions, clicks, revenue}]`; days in UTC, USD. Offerwall rows are left out
    /// (AdTally has no such format) and counted in the import's answer.
    static func levelplay(_ bytes: [UInt8]) throws(FieldError) -> NetworkReport {
        struct Row: Decodable {
            var fields: [String: JSONScalar] = [:]
            /// Fields that are objects or arrays: an error only if one is read.
            var nested = Set<String>()
            var data: [[String: JSONScalar]]?
            init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: AnyKey.self)
                for key in container.allKeys {
                    if key.stringValue == "data" {
                        data = try container.decode([[String: JSONScalar]].self, forKey: key)
                    } else if let value = try? container.decode(JSONScalar.self, forKey: key) {
                        fields[key.stringValue] = value
                    } else {
                        nested.insert(key.stringValue)
                    }
                }
            }
        }
        let rows: [Row]
        do { rows = try JSONDecoder().decode([Row].self, from: Data(bytes)) } catch {
            throw FieldError("file", "is not a LevelPlay report (a JSON array of rows): \(Self.brief(error))")
        }
        var lines: [NetworkReportLine] = []
        var leftOut: [String: Int] = [:]
        for (index, row) in rows.enumerated() {
            let items = row.data ?? [[:]]
            for (itemIndex, item) in items.enumerated() {
                let position = row.data == nil ? "[\(index)]" : "[\(index)].data[\(itemIndex)]"
                var fields = row.fields.compactMapValues(\.text)
                fields.merge(item.compactMapValues(\.text)) { _, inner in inner }
                func field(_ names: String...) throws(FieldError) -> String {
                    for name in names {
                        if let value = fields[name] { return value }
                        if row.nested.contains(name) { throw FieldError("\(position): \(name)", "must be a string or a number") }
                    }
                    throw FieldError("\(position): \(names[0])", "is missing; the LevelPlay report needs date, appKey, adFormat, adNetwork, countryCode, impressions, clicks, revenue")
                }
                let formatText = try field("adFormat", "adUnits")
                guard let format = FormatVocabulary.levelplay(formatText) else {
                    if FormatVocabulary.isOfferwall(formatText) {
                        leftOut["offerwall", default: 0] += 1
                        continue
                    }
                    throw FieldError("\(position): adFormat", "\"\(formatText.prefix(40))\" is not a LevelPlay ad format (\(FormatVocabulary.levelplayNames))")
                }
                lines.append(NetworkReportLine(
                    position: position, day: try NetworkReportValues.day(try field("date"), "\(position): date"),
                    app: try NetworkReportValues.name(try field("appKey"), "\(position): appKey"),
                    network: try NetworkReportValues.name(try field("adNetwork", "providerName", "adSource"), "\(position): adNetwork"), format: format,
                    country: try NetworkReportValues.country(fields["countryCode"] ?? fields["country"] ?? "", "\(position): countryCode"),
                    impressions: try NetworkReportValues.count(try field("impressions"), "\(position): impressions"),
                    clicks: try fields["clicks"].map { text throws(FieldError) in try NetworkReportValues.count(text, "\(position): clicks") },
                    revenueMicros: try NetworkReportValues.micros(try field("revenue"), "\(position): revenue"),
                    currency: "USD"
                ))
            }
        }
        return NetworkReport(source: .levelplay, zone: NetworkReportSource.levelplay.defaultZone, lines: lines, leftOut: leftOut)
    }

    // MARK: - Generic CSV

    /// The generic CSV (DESIGN §11): `date,app,network,format,country,impressions,clicks,revenue,currency`
    /// in any column order, and an optional `timezone` column (the same on every line) or `zone`.
    static let csvColumns = ["date", "app", "network", "format", "country", "impressions", "clicks", "revenue", "currency"]

    static func csv(_ bytes: [UInt8], zone: String?, capacity: Int = 0) throws(FieldError) -> NetworkReport {
        var lines: [NetworkReportLine] = []
        lines.reserveCapacity(capacity)
        var fileZone: String?
        var column: [String: Int]?
        var records = 0
        var table = NetworkCSVExports.NameTable()
        // A record at a time, straight into a line: half a million lines are never held as text.
        try forEachRecord(bytes) { (record) throws(FieldError) in
            guard let column else {
                let names = record.fields.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
                for name in csvColumns where !names.contains(name) {
                    throw FieldError(
                        "header",
                        "has no \(name) column; it must name \(csvColumns.joined(separator: ",")); it reads \"\(NetworkReport.excerpt(record.fields.joined(separator: ",")))\". "
                            + "A network's own report or dashboard export is imported with its source (--source admob, max or levelplay; API source=)"
                    )
                }
                var seen: [String: Int] = [:]
                for (index, name) in names.enumerated() where !name.isEmpty {
                    guard seen.updateValue(index, forKey: name) == nil else { throw FieldError("header", "names \(name.prefix(40)) twice") }
                }
                column = seen
                return
            }
            // Refused at the first line over the limit, before it is read.
            records += 1
            guard records <= NetworkReport.maxLines else { throw FieldError("file", "has more than \(NetworkReport.maxLines) lines (split it by month)") }
            let position = "line \(record.line)"
            func field(_ name: String) -> String {
                guard let index = column[name], index < record.fields.count else { return "" }
                return record.fields[index]
            }
            let written = field("timezone").isEmpty ? field("zone") : field("timezone")
            if !written.isEmpty {
                guard ReportQuery.isZone(written) else { throw FieldError("\(position): timezone", "\"\(written.prefix(40))\" is not an IANA time zone") }
                guard fileZone == nil || fileZone == written else {
                    throw FieldError("\(position): timezone", "is \(written), an earlier line's is \(fileZone!): one file is in one zone")
                }
                fileZone = fileZone ?? written
            }
            guard let format = AdFormat(rawValue: field("format").trimmingCharacters(in: .whitespaces).lowercased()) else {
                throw FieldError("\(position): format", "must be banner, interstitial, native or rewarded")
            }
            let clicks = field("clicks").trimmingCharacters(in: .whitespaces)
            lines.append(NetworkReportLine(
                position: position, day: try NetworkReportValues.day(field("date"), "\(position): date"),
                app: table.intern(try NetworkReportValues.name(field("app"), "\(position): app")),
                network: table.intern(try NetworkReportValues.name(field("network"), "\(position): network")), format: format,
                country: try NetworkReportValues.country(field("country"), "\(position): country"),
                impressions: try NetworkReportValues.count(field("impressions"), "\(position): impressions"),
                clicks: clicks.isEmpty ? nil : try NetworkReportValues.count(clicks, "\(position): clicks"),
                revenueMicros: try NetworkReportValues.micros(field("revenue"), "\(position): revenue"),
                currency: try NetworkReportValues.currency(field("currency"), "\(position): currency")
            ))
        }
        guard column != nil else { throw FieldError("file", "is empty; it starts with a header line") }
        if let zone, let fileZone, zone != fileZone {
            throw FieldError("timezone", "the file says \(fileZone) and the import was asked for \(zone)")
        }
        return NetworkReport(source: .csv, zone: fileZone ?? zone ?? NetworkReportSource.csv.defaultZone, lines: lines)
    }

    /// Every record of a CSV that is not blank, in order, read 64 KiB at a time.
    static func forEachRecord(_ bytes: [UInt8], _ body: (CSVRecordReader.Record) throws(FieldError) -> Void) throws(FieldError) {
        var reader = CSVRecordReader()
        var start = 0
        while start < bytes.count {
            for record in reader.feed(bytes[start..<min(start + (1 << 16), bytes.count)]) where !record.isBlank { try body(record) }
            start += 1 << 16
        }
        if let last = reader.finish(), !last.isBlank { try body(last) }
    }

    /// The file's first byte after whitespace opens a JSON object or array.
    static func startsJSON(_ bytes: [UInt8]) -> Bool {
        guard let first = bytes.first(where: { !($0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09) }) else { return false }
        return first == UInt8(ascii: "{") || first == UInt8(ascii: "[")
    }

    /// A decoding error in a sentence, without Swift's type names.
    static func brief(_ error: any Error) -> String {
        func path(_ context: DecodingError.Context) -> String { context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined() }
        switch error {
        case DecodingError.dataCorrupted(let context), DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            return path(context).isEmpty ? "not valid JSON" : "\(path(context)) has the wrong type"
        case DecodingError.keyNotFound(let key, let context):
            return "\(path(context)).\(key.stringValue) is missing"
        default:
            return "not valid JSON"
        }
    }
}

/// A JSON string, number or null as text (numbers exactly as decimals); anything else
/// (an object, an array, a boolean) is a decoding error.
struct JSONScalar: Decodable, Sendable {
    var text: String?

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            text = nil
        } else if let string = try? container.decode(String.self) {
            text = string
        } else if let integer = try? container.decode(Int64.self) {
            text = String(integer)
        } else {
            text = "\(try container.decode(Decimal.self))"
        }
    }
}

struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) {
        self.stringValue = String(intValue)
        self.intValue = intValue
    }
}

/// Each source's ad format names, mapped to AdTally's four (DESIGN §11). App open ads
/// are full-screen and shown as interstitials; rewarded interstitials are rewarded.
public enum FormatVocabulary {
    static let admobNames = "BANNER, INTERSTITIAL, NATIVE, REWARDED, REWARDED_INTERSTITIAL, APP_OPEN"
    static func admob(_ text: String) -> AdFormat? {
        switch text.trimmingCharacters(in: .whitespaces).uppercased() {
        case "BANNER": .banner
        case "INTERSTITIAL", "APP_OPEN": .interstitial
        case "NATIVE": .native
        case "REWARDED", "REWARDED_INTERSTITIAL": .rewarded
        default: nil
        }
    }

    static let maxNames = "BANNER, MREC, LEADER, INTER, APPOPEN, REWARD, REWARDED_INTER, NATIVE"
    static func max(_ text: String) -> AdFormat? {
        switch text.trimmingCharacters(in: .whitespaces).uppercased() {
        case "BANNER", "MREC", "LEADER": .banner
        case "INTER", "INTERSTITIAL", "APPOPEN", "APP_OPEN": .interstitial
        case "NATIVE": .native
        case "REWARD", "REWARDED", "REWARDED_INTER": .rewarded
        default: nil
        }
    }

    static let levelplayNames = "rewarded, interstitial, banner, native (offerwall is left out)"
    static func levelplay(_ text: String) -> AdFormat? {
        switch text.trimmingCharacters(in: .whitespaces).lowercased().filter({ $0 != " " && $0 != "_" }) {
        case "banner": .banner
        case "interstitial": .interstitial
        case "native", "nativead": .native
        case "rewarded", "rewardedvideo", "video": .rewarded
        default: nil
        }
    }

    static func isOfferwall(_ text: String) -> Bool {
        text.lowercased().filter { $0.isLetter } == "offerwall"
    }
}

/// The networks' names for themselves, as AdTally's event names (DESIGN §11): the
/// spellings the reports use ("AdMob Network", "APPLOVIN_NETWORK", "FACEBOOK_BIDDING",
/// "ironSource") for the names the apps send. A name not known here, and not mapped
/// with `adtally networks map`, is refused at import.
public enum NetworkNames {
    static let aliases: [String: String] = [
        "admob": "admob", "admobnetwork": "admob", "googleadmob": "admob", "google": "admob", "googlebidding": "admob",
        "admobbidding": "admob", "googlemobileads": "admob",
        "applovin": "applovin", "applovinexchange": "applovin", "applovinmax": "applovin",
        "facebook": "meta", "meta": "meta", "metaaudiencenetwork": "meta", "facebookaudiencenetwork": "meta", "audiencenetwork": "meta",
        "unity": "unity", "unityads": "unity",
        "ironsource": "ironsource", "ironsourceads": "ironsource",
        "vungle": "liftoff", "liftoff": "liftoff", "liftoffmonetize": "liftoff",
        "mintegral": "mintegral", "pangle": "pangle", "tiktok": "pangle", "inmobi": "inmobi", "chartboost": "chartboost",
        "fyber": "dtexchange", "dtexchange": "dtexchange", "digitalturbine": "dtexchange", "digitalturbineexchange": "dtexchange",
    ]

    /// AdTally's name for a network by one of its usual spellings ("AdMob Network",
    /// "APPLOVIN_NETWORK", "FACEBOOK_BIDDING", "ironSource"), or nil.
    public static func known(_ written: String) -> String? {
        var key = written.lowercased().filter { $0.isASCII && ($0.isLetter || $0.isNumber) }
        if let known = aliases[key] { return known }
        for suffix in ["network", "bidding", "exchange", "sdk"] where key.hasSuffix(suffix) && key.count > suffix.count {
            key.removeLast(suffix.count)
            if let known = aliases[key] { return known }
        }
        return nil
    }

    /// The name as AdTally's events would spell it: a generic CSV's as written
    /// (lower-cased), the networks' own reports' without MAX's `_NETWORK`, `_BIDDING`,
    /// `_EXCHANGE`; nil when no event could carry it. An import takes it only when the
    /// app's events name that network (else it has to be mapped).
    public static func plain(_ written: String, source: NetworkReportSource) -> String? {
        let plain = written.trimmingCharacters(in: .whitespaces).lowercased()
        if source == .csv { return EventValidator.isNetworkName(plain) ? plain : nil }
        var key = plain
        for suffix in ["_network", "_bidding", "_exchange"] where key.hasSuffix(suffix) && key.count > suffix.count {
            key.removeLast(suffix.count)
        }
        return EventValidator.isNetworkName(key) ? key : nil
    }

    /// `known`, else `plain`: the name an import would look for.
    public static func adTally(_ written: String, source: NetworkReportSource) -> String? {
        known(written) ?? plain(written, source: source)
    }
}

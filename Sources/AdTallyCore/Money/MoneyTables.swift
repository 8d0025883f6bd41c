import Foundation

/// A rate card entry (DESIGN §3): the CPM and CPT a network pays for a format in a
/// country (`*`: any), in a currency, from a UTC date until the same key's next date.
public struct RateCardEntry: Sendable, Equatable, Codable {
    public var network: String
    public var format: String
    /// ISO 3166-1 alpha-2, or `*` for any country.
    public var country: String
    /// ISO 4217.
    public var currency: String
    /// Per thousand impressions, in micros of `currency`.
    public var cpmMicros: Int64
    /// Per tap, in micros of `currency`.
    public var cptMicros: Int64
    /// `YYYY-MM-DD` (UTC).
    public var effectiveFrom: String

    public init(network: String, format: String, country: String, currency: String, cpmMicros: Int64, cptMicros: Int64, effectiveFrom: String) {
        self.network = network
        self.format = format
        self.country = country
        self.currency = currency
        self.cpmMicros = cpmMicros
        self.cptMicros = cptMicros
        self.effectiveFrom = effectiveFrom
    }

    enum CodingKeys: String, CodingKey {
        case network, format, country, currency, cpm, cpt
        case effectiveFrom = "effective_from"
    }

    /// As the API shows it: `cpm` and `cpt` as decimal strings of the currency.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(network, forKey: .network)
        try container.encode(format, forKey: .format)
        try container.encode(country, forKey: .country)
        try container.encode(currency, forKey: .currency)
        try container.encode(Money.plain(micros: cpmMicros, currency: currency), forKey: .cpm)
        try container.encode(Money.plain(micros: cptMicros, currency: currency), forKey: .cpt)
        try container.encode(effectiveFrom, forKey: .effectiveFrom)
    }

    /// From the API's JSON: every field validated as the CSV's are (`country` defaults to
    /// `*`, `cpm` and `cpt` to 0; amounts as strings or numbers).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        // Absent is 0; anything present must be a decimal (null, true or {} is refused, not
        // stored as 0: a rate re-prices history).
        func amount(_ key: CodingKeys) throws -> String {
            container.contains(key) ? try container.decimalText(forKey: key) : "0"
        }
        self = try Self.parse(
            network: try container.decode(String.self, forKey: .network), format: try container.decode(String.self, forKey: .format),
            country: try container.decodeIfPresent(String.self, forKey: .country) ?? "*", currency: try container.decode(String.self, forKey: .currency),
            cpm: try amount(.cpm), cpt: try amount(.cpt), effectiveFrom: try container.decode(String.self, forKey: .effectiveFrom)
        )
    }

    /// Refuses two entries for one key (network, format, country, date) in one change.
    public static func checkUnique(_ entries: [RateCardEntry]) throws(MoneyTableError) {
        var seen = Set<String>()
        for entry in entries where !seen.insert("\(entry.network) \(entry.format) \(entry.country) \(entry.effectiveFrom)").inserted {
            throw MoneyTableError("rates", "\(entry.network) \(entry.format) \(entry.country) from \(entry.effectiveFrom) is given twice")
        }
    }

    /// The import file's header (DESIGN §3).
    public static let csvHeader = ["network", "format", "country", "currency", "cpm", "cpt", "effective_from"]

    /// An entry from text fields, validated; the error names the field and the rule.
    public static func parse(
        network: String, format: String, country: String, currency: String, cpm: String, cpt: String, effectiveFrom: String
    ) throws(MoneyTableError) -> RateCardEntry {
        guard EventValidator.isNetworkName(network) else {
            throw MoneyTableError("network", "must match [a-z0-9_.-]{1,32}")
        }
        guard AdFormat(rawValue: format) != nil else { throw MoneyTableError("format", "must be banner, interstitial, native or rewarded") }
        guard let country = country == "*" ? "*" : EventValidator.countryCode(country) else {
            throw MoneyTableError("country", "must be an ISO 3166-1 alpha-2 code (US, JP) or * for any country")
        }
        guard let currency = ISOCodes.currency(currency) else { throw MoneyTableError("currency", "must be an ISO 4217 code (USD, EUR, JPY)") }
        guard let cpmMicros = Money.parseMicros(cpm) else { throw MoneyTableError("cpm", Money.decimalRule) }
        guard let cptMicros = Money.parseMicros(cpt) else { throw MoneyTableError("cpt", Money.decimalRule) }
        guard let day = ReportQuery.parseDate(effectiveFrom) else { throw MoneyTableError("effective_from", "must be a date, YYYY-MM-DD") }
        return RateCardEntry(
            network: network, format: format, country: country, currency: currency,
            cpmMicros: cpmMicros, cptMicros: cptMicros, effectiveFrom: ReportQuery.formatDate(day)
        )
    }

    /// Entries from a rate card CSV (header `network,format,country,currency,cpm,cpt,effective_from`,
    /// in any column order); every bad line is an error naming its line and field.
    public static func parseCSV(_ bytes: some Sequence<UInt8>) throws(MoneyTableError) -> [RateCardEntry] {
        let records = CSVRecordReader.records(of: bytes)
        guard let header = records.first else { throw MoneyTableError("file", "is empty; the header is \(csvHeader.joined(separator: ","))") }
        let names = header.fields.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        var index: [String: Int] = [:]
        for name in csvHeader {
            guard let position = names.firstIndex(of: name) else {
                throw MoneyTableError("header", "has no \(name) column; it must name \(csvHeader.joined(separator: ","))")
            }
            index[name] = position
        }
        var entries: [RateCardEntry] = []
        for record in records.dropFirst() {
            func field(_ name: String) -> String {
                let position = index[name]!
                return position < record.fields.count ? record.fields[position].trimmingCharacters(in: .whitespaces) : ""
            }
            do {
                entries.append(try parse(
                    network: field("network"), format: field("format"), country: field("country"), currency: field("currency"),
                    cpm: field("cpm"), cpt: field("cpt"), effectiveFrom: field("effective_from")
                ))
            } catch {
                throw MoneyTableError("line \(record.line): \(error.field)", error.rule)
            }
        }
        return entries
    }
}

/// One FX rate: units of `currency` per one unit of `base` on a UTC date.
public struct FXRate: Sendable, Equatable, Codable {
    /// `YYYY-MM-DD` (UTC).
    public var date: String
    public var base: String
    public var currency: String
    /// A positive decimal string, kept exactly.
    public var rate: String
    /// Set when the rate was not published for `date` and the one of this earlier date
    /// was carried over the gap (`--fill-gaps`).
    public var carriedFrom: String?

    public init(date: String, base: String, currency: String, rate: String, carriedFrom: String? = nil) {
        self.date = date
        self.base = base
        self.currency = currency
        self.rate = rate
        self.carriedFrom = carriedFrom
    }

    enum CodingKeys: String, CodingKey {
        case date, base, currency, rate
        case carriedFrom = "carried_from"
    }

    /// Refuses two different rates for one day, base and currency in one import.
    public static func checkUnique(_ rates: [FXRate]) throws(MoneyTableError) {
        var seen: [String: String] = [:]
        for rate in rates {
            let key = "\(rate.date) \(rate.base) \(rate.currency)"
            if let earlier = seen[key], earlier != rate.rate {
                throw MoneyTableError("rates", "\(rate.currency) per \(rate.base) on \(rate.date) is given twice (\(earlier) and \(rate.rate))")
            }
            seen[key] = rate.rate
        }
    }

    /// Most digits on either side of a rate's decimal point.
    static let maxDigits = 12

    /// A rate from text fields, validated.
    public static func parse(date: String, base: String, currency: String, rate: String) throws(MoneyTableError) -> FXRate {
        guard let day = ReportQuery.parseDate(date) else { throw MoneyTableError("date", "must be a date, YYYY-MM-DD") }
        guard let base = ISOCodes.currency(base) else { throw MoneyTableError("base", "must be an ISO 4217 code (EUR, USD)") }
        guard let currency = ISOCodes.currency(currency) else { throw MoneyTableError("currency", "must be an ISO 4217 code (USD, JPY)") }
        guard currency != base else { throw MoneyTableError("currency", "must differ from the base (\(base) is 1 by definition)") }
        guard let normalized = normalizedRate(rate) else {
            throw MoneyTableError("rate", "must be a positive decimal number (units of \(currency) per 1 \(base)), at most \(maxDigits) digits before and after the point")
        }
        return FXRate(date: ReportQuery.formatDate(day), base: base, currency: currency, rate: normalized)
    }

    /// "22 November 2024" (the ECB's daily file) as 2024-11-22; nil for anything else.
    static func ecbDate(_ text: String) -> String? {
        let months = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"]
        let parts = text.split(separator: " ")
        guard parts.count == 3, let day = Int(parts[0]), let month = months.firstIndex(of: parts[1].lowercased()), let year = Int(parts[2]),
              (1...31).contains(day), (1900...9999).contains(year) else { return nil }
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(year)-\(two(month + 1))-\(two(day))"
    }

    /// The rate without redundant zeros, or nil unless a positive decimal.
    static func normalizedRate(_ text: String) -> String? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let whole = parts.first, !whole.isEmpty, whole.count <= maxDigits,
              whole.allSatisfy(\.isASCII), whole.allSatisfy(\.isNumber) else { return nil }
        var fraction = parts.count == 2 ? String(parts[1]) : ""
        guard fraction.count <= maxDigits, fraction.allSatisfy({ $0.isASCII && $0.isNumber }), parts.count == 1 || !fraction.isEmpty else { return nil }
        while fraction.hasSuffix("0") { fraction.removeLast() }
        var integer = String(whole.drop { $0 == "0" })
        if integer.isEmpty { integer = "0" }
        guard integer != "0" || !fraction.isEmpty else { return nil }
        return fraction.isEmpty ? integer : integer + "." + fraction
    }

    /// Rates from an FX CSV: either `date,currency,rate` (DESIGN §3) or the ECB's daily
    /// reference shape (`Date,USD,JPY,…`, one row per day, `N/A` where a currency has no
    /// rate that day). `base` names what the rates are per one unit of.
    public static func parseCSV(_ bytes: some Sequence<UInt8>, base: String) throws(MoneyTableError) -> [FXRate] {
        var skipped = Set<String>()
        return try parseCSV(bytes, base: base, skipped: &skipped)
    }

    /// As `parseCSV(_:base:)`; `skipped` gets the ECB columns of currencies that are no
    /// longer ISO 4217 codes (CYP, HRK, …: the history file keeps them), which no event can
    /// carry, so their rates are not needed.
    public static func parseCSV(_ bytes: some Sequence<UInt8>, base: String, skipped: inout Set<String>) throws(MoneyTableError) -> [FXRate] {
        var reader = try FXCSVReader(base: base)
        var rates = try reader.feed(bytes).map(\.rate)
        rates += try reader.finish().map(\.rate)
        skipped.formUnion(reader.skipped)
        return rates
    }
}

/// Reads an FX CSV (`FXRate.parseCSV`'s shapes) as it arrives, a chunk at a time:
/// the rates of the lines each chunk completes, each with its line, so an import of
/// years of rates never holds more than a chunk's records.
public struct FXCSVReader: Sendable {
    private enum Shape: Sendable {
        /// `date,currency,rate` in any column order: their positions.
        case long(date: Int, currency: Int, rate: Int)
        /// The ECB's: the header's names, upper-cased where they are currencies.
        case ecb([String])
    }

    /// What the rates are per one unit of.
    public let base: String
    /// ECB columns of currencies no longer in ISO 4217, left out.
    public private(set) var skipped = Set<String>()
    private var records = CSVRecordReader()
    private var shape: Shape?

    /// A reader of rates per one `base`.
    public init(base: String) throws(MoneyTableError) {
        guard let base = ISOCodes.currency(base) else { throw MoneyTableError("base", "must be an ISO 4217 code (EUR, USD)") }
        self.base = base
    }

    /// The rates (with their lines) of the records `bytes` completes.
    public mutating func feed(_ bytes: some Sequence<UInt8>) throws(MoneyTableError) -> [(line: Int, rate: FXRate)] {
        try rates(of: records.feed(bytes))
    }

    /// The rates of the last record; a file without a header is an error.
    public mutating func finish() throws(MoneyTableError) -> [(line: Int, rate: FXRate)] {
        let rates = try rates(of: records.finish().map { [$0] } ?? [])
        guard shape != nil else { throw MoneyTableError("file", "is empty; the header is date,currency,rate (or the ECB's Date,USD,JPY,…)") }
        return rates
    }

    private mutating func rates(of records: [CSVRecordReader.Record]) throws(MoneyTableError) -> [(line: Int, rate: FXRate)] {
        var rates: [(line: Int, rate: FXRate)] = []
        for record in records {
            // Blank lines are no records.
            guard !record.isBlank else { continue }
            guard let shape else {
                self.shape = try Self.shape(ofHeader: record.fields, skipped: &skipped)
                continue
            }
            func wrap(_ body: () throws(MoneyTableError) -> FXRate) throws(MoneyTableError) -> FXRate {
                do { return try body() } catch { throw MoneyTableError("line \(record.line): \(error.field)", error.rule) }
            }
            func field(_ position: Int) -> String { position < record.fields.count ? record.fields[position].trimmingCharacters(in: .whitespaces) : "" }
            switch shape {
            case let .long(date, currency, rate):
                rates.append((record.line, try wrap { () throws(MoneyTableError) in
                    try FXRate.parse(date: field(date), base: base, currency: field(currency), rate: field(rate))
                }))
            case let .ecb(names):
                // The daily file writes "22 November 2024", the history file 2024-11-22.
                let written = field(0)
                let date = FXRate.ecbDate(written) ?? written
                for (position, name) in names.enumerated().dropFirst() where !name.isEmpty && !skipped.contains(name) {
                    let value = field(position)
                    if value.isEmpty || value.uppercased() == "N/A" { continue }
                    rates.append((record.line, try wrap { () throws(MoneyTableError) in
                        try FXRate.parse(date: date, base: base, currency: name, rate: value)
                    }))
                }
            }
        }
        return rates
    }

    private static func shape(ofHeader fields: [String], skipped: inout Set<String>) throws(MoneyTableError) -> Shape {
        let names = fields.map { $0.trimmingCharacters(in: .whitespaces) }
        let lower = names.map { $0.lowercased() }
        if let date = lower.firstIndex(of: "date"), let currency = lower.firstIndex(of: "currency"), let rate = lower.firstIndex(of: "rate") {
            return .long(date: date, currency: currency, rate: rate)
        }
        guard lower.first == "date" else { throw MoneyTableError("header", "must be date,currency,rate or the ECB's Date,USD,JPY,…") }
        // The ECB's shape: a column per currency (a trailing empty header cell is common).
        var columns = [names[0]]
        var seen = Set<String>()
        for name in names.dropFirst() {
            let code = ISOCodes.asciiUppercased(name) ?? name
            if !code.isEmpty {
                // A currency twice would multiply every row's rates.
                guard seen.insert(code).inserted else { throw MoneyTableError("header", "names \(code) twice") }
                if !ISOCodes.isCurrency(code) && code.count == 3 { skipped.insert(code) }
            }
            columns.append(code)
        }
        return .ecb(columns)
    }
}

/// A rate card or FX value that breaks a rule: names the field and the rule.
public typealias MoneyTableError = FieldError

extension Money {
    /// Micros as a plain decimal: the currency's decimals at least, more only when the
    /// amount has them (a CPM of 0.125 USD stays 0.125).
    public static func plain(micros: Int64, currency: String) -> String {
        var text = format(micros: Int128(micros), per: 1, digits: 6)
        let keep = digits(currency)
        while text.hasSuffix("0"), let point = text.firstIndex(of: "."), text.distance(from: point, to: text.endIndex) - 1 > keep { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text
    }

    static let decimalRule = "must be a decimal amount ≥ 0 with at most 6 decimals (2.50), below 1,000,000,000"

    /// A non-negative decimal amount ("2.5", "0.125", "3") as micros; nil unless it has
    /// at most 6 decimals and is below 10^9.
    public static func parseMicros(_ text: String) -> Int64? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let whole = parts.first, !whole.isEmpty, whole.count <= 9,
              whole.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        let fraction = parts.count == 2 ? parts[1] : ""
        guard fraction.count <= 6, fraction.allSatisfy({ $0.isASCII && $0.isNumber }), parts.count == 1 || !fraction.isEmpty else { return nil }
        var micros = Int64(whole)! * 1_000_000
        var place: Int64 = 100_000
        for digit in fraction {
            micros += Int64(digit.wholeNumberValue!) * place
            place /= 10
        }
        return micros
    }
}

extension KeyedDecodingContainer {
    /// A decimal given as a JSON string ("2.50") or number (2.5), as text for the
    /// exact parsers; anything else is an error naming the key.
    public func decimalText(forKey key: Key) throws -> String {
        if let text = try? decode(String.self, forKey: key) { return text }
        if let number = try? decode(Decimal.self, forKey: key) { return "\(number)" }
        throw MoneyTableError(key.stringValue, "must be a decimal, as a string (\"2.50\") or a number")
    }
}

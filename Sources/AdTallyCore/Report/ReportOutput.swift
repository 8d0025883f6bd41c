/// One group of a report: its dimension values (as text, in the query's order;
/// nil when the events had none) and its sums, with the compared period's sums.
public struct ReportRow: Sendable, Equatable {
    /// Dimension values, rendered (dates `YYYY-MM-DD`, hours with their offset).
    public var dimensions: [String?]
    /// The sums of this period.
    public var counts: ReportCounts
    /// The sums of the compared period (zero when it had none); nil without `compare`.
    public var previous: ReportCounts?

    /// A row.
    public init(dimensions: [String?], counts: ReportCounts, previous: ReportCounts? = nil) {
        self.dimensions = dimensions
        self.counts = counts
        self.previous = previous
    }
}

/// A column of the output.
public struct ReportColumn: Sendable, Equatable {
    /// Its name in JSON `columns` and the CSV header.
    public var name: String
    /// How its values read.
    public var type: ReportValueType
}

/// One cell, before it is written as JSON, CSV or a terminal table.
public enum ReportCell: Sendable, Equatable {
    case null
    case text(String)
    case integer(Int128)
    case ratio(Double)
    /// An amount in micros (`micros / per`, exactly), shown with `digits` decimals (the currency's precision).
    case money(micros: Int128, per: Int128, digits: Int)
}

/// The columns of a query and the cells of its rows: the one place metric values
/// are turned into what a reader sees, for every output format.
public struct ReportLayout: Sendable {
    /// The query.
    public let query: ReportQuery
    /// Dimensions, then each metric (with `_previous` and `_change` when comparing).
    public let columns: [ReportColumn]
    /// Decimals of the report currency.
    let digits: Int

    /// The layout of a query's output.
    public init(query: ReportQuery) {
        self.query = query
        var columns = query.dimensions.map { ReportColumn(name: $0.rawValue, type: $0.valueType) }
        for metric in query.metrics {
            columns.append(ReportColumn(name: metric.rawValue, type: metric.valueType))
            if query.comparison != nil {
                columns.append(ReportColumn(name: metric.rawValue + "_previous", type: metric.valueType))
                columns.append(ReportColumn(name: metric.rawValue + "_change", type: .change))
            }
        }
        for metric in query.cohortMetrics { columns.append(ReportColumn(name: metric.name, type: metric.valueType)) }
        self.columns = columns
        self.digits = Money.digits(query.currency)
    }

    /// Appends a row as a CSV record (the cells of `cells`, without building them).
    public func appendCSV(_ row: ReportRow, to out: inout [UInt8]) {
        for (index, dimension) in query.dimensions.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            guard index < row.dimensions.count, let value = row.dimensions[index] else { continue }
            if dimension == .errorCode || dimension.valueType == .date || dimension.valueType == .month {
                out.append(contentsOf: value.utf8)  // digits and dashes: never quoted, never a formula
            } else {
                ReportText.appendCSVText(value, to: &out)
            }
        }
        var first = query.dimensions.isEmpty
        forEachMetricCell(row.counts, previous: row.previous) { cell in
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            ReportText.appendCSV(cell, to: &out)
        }
        out.append(0x0D)
        out.append(0x0A)
    }

    /// The cells of a row, one per column.
    public func cells(_ row: ReportRow) -> [ReportCell] {
        var cells: [ReportCell] = []
        cells.reserveCapacity(columns.count)
        for (index, dimension) in query.dimensions.enumerated() {
            guard index < row.dimensions.count, let value = row.dimensions[index] else {
                cells.append(.null)
                continue
            }
            if dimension == .errorCode, let number = Int128(value) { cells.append(.integer(number)) } else { cells.append(.text(value)) }
        }
        metricCells(row.counts, previous: row.previous, into: &cells)
        return cells
    }

    /// The metric cells of totals (no dimension cells).
    public func totalCells(_ counts: ReportCounts, previous: ReportCounts?) -> [ReportCell] {
        var cells: [ReportCell] = []
        metricCells(counts, previous: previous, into: &cells)
        return cells
    }

    private func metricCells(_ counts: ReportCounts, previous: ReportCounts?, into cells: inout [ReportCell]) {
        forEachMetricCell(counts, previous: previous) { cells.append($0) }
    }

    /// The metric cells in column order: each metric, and with `compare` its earlier value and change.
    private func forEachMetricCell(_ counts: ReportCounts, previous: ReportCounts?, _ body: (ReportCell) -> Void) {
        for metric in query.metrics {
            let value = metric.value(counts)
            let digits = Self.digits(of: metric, currency: self.digits)
            body(cell(value, digits: digits))
            if query.comparison != nil {
                let earlier = metric.value(previous ?? ReportCounts())
                body(cell(earlier, digits: digits))
                body(cell(value.change(from: earlier)))
            }
        }
        for metric in query.cohortMetrics {
            body(cell(metric.value(counts.cohort), digits: metric.valueType == .moneyPerDevice ? min(digits + 4, 6) : digits))
        }
    }

    /// Decimals of a money metric: the currency's, and 4 more (at most micros) for money
    /// per device, whose values are cents and less (an ARPDAU of $0.0123).
    public static func digits(of metric: ReportMetric, currency digits: Int) -> Int {
        metric.valueType == .moneyPerDevice ? min(digits + 4, 6) : digits
    }

    func cell(_ value: MetricValue, digits: Int? = nil) -> ReportCell {
        switch value {
        case .null: .null
        case .integer(let number): .integer(number)
        case .ratio(let number): number.isFinite ? .ratio(number) : .null
        case .micros(let micros, let per): .money(micros: micros, per: per, digits: digits ?? self.digits)
        case .text(let text): .text(text)
        }
    }
}

/// Writing cells as JSON, CSV (RFC 4180) and ratios as text.
public enum ReportText {
    /// Appends an integer's decimal digits.
    public static func appendInteger(_ value: Int128, to out: inout [UInt8]) {
        guard let small = Int64(exactly: value) else {
            out.append(contentsOf: String(value).utf8)
            return
        }
        if small < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = small.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes of scratch, enough for 20 digits
        withUnsafeMutableBytes(of: &digits) { buffer in
            var position = buffer.count
            repeat {
                position -= 1
                buffer[position] = UInt8(truncatingIfNeeded: 0x30 &+ magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            out.append(contentsOf: buffer[position...])
        }
    }

    /// Appends a ratio with at most 6 decimals, no exponent (see `ratio`).
    public static func appendRatio(_ value: Double, to out: inout [UInt8]) {
        let scaled = (value * 1_000_000).rounded()
        guard scaled.magnitude < 9e17 else {
            out.append(contentsOf: String(value).utf8)
            return
        }
        let micros = Int64(scaled)
        if micros < 0 { out.append(UInt8(ascii: "-")) }
        let magnitude = micros.magnitude
        appendInteger(Int128(magnitude / 1_000_000), to: &out)
        var fraction = magnitude % 1_000_000
        guard fraction != 0 else { return }
        out.append(UInt8(ascii: "."))
        var width = 6
        while fraction % 10 == 0 { fraction /= 10; width -= 1 }
        var divisor: UInt64 = 1
        for _ in 1..<width { divisor *= 10 }
        while divisor > 0 {
            out.append(UInt8(truncatingIfNeeded: 0x30 &+ fraction / divisor % 10))
            divisor /= 10
        }
    }

    /// A ratio with at most 6 decimals, no exponent: 0.123457, 1.5, 0.
    public static func ratio(_ value: Double) -> String {
        var out: [UInt8] = []
        appendRatio(value, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// An object key: `"name":`.
    public static func appendJSONKey(_ name: String, to out: inout [UInt8]) {
        appendJSONString(name, to: &out)
        out.append(UInt8(ascii: ":"))
    }

    /// A JSON array of strings.
    public static func appendJSONStrings(_ items: [String], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "["))
        for (index, item) in items.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            appendJSONString(item, to: &out)
        }
        out.append(UInt8(ascii: "]"))
    }

    /// Appends a JSON string literal.
    public static func appendJSONString(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: [0x5C, 0x22])
            case UInt8(ascii: "\\"): out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Appends a cell as a JSON value (money as a decimal string, DESIGN §3).
    public static func appendJSON(_ cell: ReportCell, to out: inout [UInt8]) {
        switch cell {
        case .null: out.append(contentsOf: "null".utf8)
        case .text(let text): appendJSONString(text, to: &out)
        case .money(let micros, let per, let digits):
            out.append(UInt8(ascii: "\""))
            Money.append(micros: micros, per: per, digits: digits, to: &out)
            out.append(UInt8(ascii: "\""))
        case .integer(let number): appendInteger(number, to: &out)
        case .ratio(let number): appendRatio(number, to: &out)
        }
    }

    /// Appends a cell as an RFC 4180 field: numbers bare, text quoted when it must be,
    /// and text a spreadsheet would run as a formula (`startsLikeFormula`) neutralised
    /// with a leading `'`.
    public static func appendCSV(_ cell: ReportCell, to out: inout [UInt8]) {
        switch cell {
        case .null: break
        case .integer(let number): appendInteger(number, to: &out)
        case .ratio(let number): appendRatio(number, to: &out)
        case .money(let micros, let per, let digits): Money.append(micros: micros, per: per, digits: digits, to: &out)
        case .text(let text): appendCSVText(text, to: &out)
        }
    }

    /// Appends text as a CSV field (see `appendCSV`).
    public static func appendCSVText(_ text: String, to out: inout [UInt8]) {
        let utf8 = text.utf8
        let isFormula = startsLikeFormula(text)
        let needsQuotes = isFormula || utf8.contains { $0 == UInt8(ascii: ",") || $0 == UInt8(ascii: "\"") || $0 == 0x0A || $0 == 0x0D }
        if !needsQuotes {
            out.append(contentsOf: utf8)
            return
        }
        out.append(UInt8(ascii: "\""))
        if isFormula { out.append(UInt8(ascii: "'")) }
        for byte in utf8 {
            if byte == UInt8(ascii: "\"") { out.append(byte) }
            out.append(byte)
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Whether a spreadsheet could run the cell as a formula (OWASP's CSV injection
    /// list, widened to what spreadsheets also skip or fold): it starts with a tab, CR
    /// or LF, or its first character after any blank (ASCII or Unicode spaces, line
    /// breaks, a byte-order mark) is `= + - @` or their full-width or small forms.
    public static func startsLikeFormula(_ text: String) -> Bool {
        var scalars = text.unicodeScalars.makeIterator()
        guard var scalar = scalars.next() else { return false }
        if scalar == "\t" || scalar == "\r" || scalar == "\n" { return true }
        while isBlank(scalar) {
            guard let next = scalars.next() else { return false }
            scalar = next
        }
        switch scalar.value {
        case 0x3D, 0x2B, 0x2D, 0x40: return true  // = + - @
        case 0xFF1D, 0xFF0B, 0xFF0D, 0xFF20: return true  // full-width ＝ ＋ － ＠
        case 0xFE66, 0xFE62, 0xFE63, 0xFE6B: return true  // small ﹦ ﹢ ﹣ ﹫
        case 0x2212: return true  // minus sign
        default: return false
        }
    }

    /// Characters a spreadsheet may skip before a formula's sign.
    static func isBlank(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x09...0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x180E, 0x2000...0x200B, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF: true
        default: false
        }
    }

    /// Appends a CSV record and its CRLF.
    public static func appendCSVRecord(_ cells: [ReportCell], to out: inout [UInt8]) {
        for (index, cell) in cells.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            appendCSV(cell, to: &out)
        }
        out.append(0x0D)
        out.append(0x0A)
    }

    /// A cell for a terminal table.
    public static func plain(_ cell: ReportCell) -> String {
        switch cell {
        case .null: ""
        case .text(let text): text
        case .money(let micros, let per, let digits): Money.format(micros: micros, per: per, digits: digits)
        case .integer(let number): String(number)
        case .ratio(let number): ratio(number)
        }
    }
}

import AdTallyCore
import AdTallyStorage
import Foundation

/// The dashboard's cohorts (DESIGN §13): a triangle of the range's install days × day N
/// (each cell shaded by revenue per install, retention beside it) and the LTV curve of
/// each recent week of installs (revenue per install by day N). Every value is a cell of
/// a cohort report of the engine, as `GET /v1/reports` answers it: the triangle one
/// report by cohort, each week's curve the totals of a report over that week's cohorts.
struct DashboardCohorts {
    /// The triangle's days N (MAX's and AppsFlyer's usual ones).
    static let days = [0, 1, 2, 3, 7, 14, 30]
    /// The most install days the triangle shows (the range's last ones).
    static let maxCohorts = 30
    /// Weeks of installs drawn as LTV curves, and the days N of a curve.
    static let weeks = 4
    static let curveDays = 30

    let triangle: ReportDocument
    /// Each week of installs (newest first): its label and its report's totals.
    let curves: [(label: String, document: ReportDocument)]

    /// The reports of the selection's app: cohorts of the range's last `maxCohorts` days
    /// (up to yesterday: today's installs have no whole day yet), and the weeks before it ends.
    static func load(engine: ReportEngine, selection: DashboardRoutes.Selection) async throws -> DashboardCohorts {
        let last = min(selection.to, selection.today - 1)
        let first = max(selection.from, last - maxCohorts + 1)
        let metrics = ["installs"] + days.flatMap { ["revenue_per_install_d\($0)", "retention_d\($0)"] }
        let triangle = try await engine.page(try query(selection, from: first, to: max(first, last), dimensions: "cohort", metrics: metrics))
        var curves: [(String, ReportDocument)] = []
        for week in 0..<weeks {
            let to = last - 7 * week, from = to - 6
            let curve = ["installs"] + (0...curveDays).map { "revenue_per_install_d\($0)" }
            let document = try await engine.page(try query(selection, from: from, to: to, dimensions: "", metrics: curve))
            curves.append(("installs \(ReportQuery.formatDate(from).dropFirst(5))–\(ReportQuery.formatDate(to).dropFirst(5))", document))
        }
        return DashboardCohorts(triangle: triangle, curves: curves)
    }

    /// A cohort report query through the same parser as `GET /v1/reports`.
    static func query(_ selection: DashboardRoutes.Selection, from: Int, to: Int, dimensions: String, metrics: [String]) throws -> ReportQuery {
        var parameters = [("apps", selection.app.id), ("from", ReportQuery.formatDate(from)), ("to", ReportQuery.formatDate(to)), ("metrics", metrics.joined(separator: ","))]
        if !dimensions.isEmpty { parameters.append(("dimensions", dimensions)) }
        do {
            return try ReportQuery.parse(parameters, readable: selection.apps, isAdmin: selection.isAdmin, output: .json)
        } catch {
            throw ProblemDetails(.badRequest, detail: error.description)
        }
    }

    /// A cell's number (money in units of the currency) and the engine's text of it.
    static func value(_ cell: ReportCell) -> (number: Double?, text: String) {
        switch cell {
        case .null: (nil, "")
        case .integer(let value): (Double(value), ReportText.plain(cell))
        case .ratio(let value): (value, String(format: "%.1f%%", value * 100))
        case .money(let micros, let per, _): (Double(micros) / Double(per) / 1_000_000, ReportText.plain(cell))
        case .text: (nil, ReportText.plain(cell))
        }
    }

    // MARK: - HTML

    func html() -> String {
        let currency = triangle.layout.query.currency
        var out = "<section class=\"cohorts\"><h2>Cohorts <span class=\"muted\">install days in \(HTML.escape(triangle.layout.query.timezone)) · "
        out += "revenue per install (\(HTML.escape(currency)), cumulative) and retention by day N · an empty cell: day N has not passed</span></h2>"
        out += "<div class=\"cohort-grid\"><figure class=\"triangle\"><figcaption>Cohort triangle</figcaption>"
        out += triangle.rows.isEmpty
            ? "<p class=\"muted\">No installs in these days: a device's install is the first day AdTally sees an event with its <code>device</code>.</p></figure>"
            : "\(triangleSVG())</figure>"
        out += "<figure><figcaption>Revenue per install by day N, per week of installs (LTV)</figcaption>\(curve.svg())"
        out += "<ul class=\"legend\">" + curve.series.map { "<li><span class=\"swatch c\($0.colour)\"></span>\(HTML.escape($0.name))</li>" }.joined() + "</ul></figure></div>"
        if !triangle.notes.cohorts.isEmpty {
            out += "<ul class=\"notes\">" + triangle.notes.cohorts.map { "<li>\(HTML.escape($0))</li>" }.joined() + "</ul>"
        }
        return out + "</section>"
    }

    /// The triangle as SVG: a row per install day (oldest first), its installs, then per
    /// day N a cell shaded by revenue per install (against the largest drawn), its text
    /// and retention. Each drawn cell is a `rect.cell` with `data-cohort`, `data-day`,
    /// `data-value` (revenue per install) and `data-retention`: the browser test checks
    /// them against the report API.
    func triangleSVG() -> String {
        let columns = triangle.layout.columns.map(\.name)
        let rowHeight = 22.0, head = 26.0, dayWidth = 118.0, left = 150.0
        let width = left + dayWidth * Double(Self.days.count), height = head + rowHeight * Double(triangle.rows.count) + 4
        var cells: [(row: Int, day: Int, value: Double?, text: String, retention: Double?, retentionText: String)] = []
        var installs: [String] = []
        var cohorts: [String] = []
        for (index, row) in triangle.rows.enumerated() {
            let values = triangle.layout.cells(row)
            cohorts.append(row.dimensions.first.flatMap { $0 } ?? "")
            installs.append(Self.value(values[columns.firstIndex(of: "installs")!]).text)
            for (position, day) in Self.days.enumerated() {
                let money = Self.value(values[columns.firstIndex(of: "revenue_per_install_d\(day)")!])
                let retention = Self.value(values[columns.firstIndex(of: "retention_d\(day)")!])
                cells.append((index, position, money.number, money.text, retention.number, retention.text))
            }
        }
        let top = cells.compactMap(\.value).max() ?? 0
        var out = """
            <svg class="cohorts" data-chart="cohorts" viewBox="0 0 \(Int(width)) \(Int(height))" role="img" aria-label="Cohort triangle: revenue per install and retention by install day and day N" xmlns="http://www.w3.org/2000/svg">
            <text class="tick" x="4" y="17">install day</text><text class="tick" x="\(Int(left - 8))" y="17" text-anchor="end">installs</text>
            """
        for (position, day) in Self.days.enumerated() {
            out += "<text class=\"tick\" x=\(quote(left + dayWidth * (Double(position) + 0.5))) y=\"17\" text-anchor=\"middle\">D\(day)</text>"
        }
        for (index, cohort) in cohorts.enumerated() {
            let y = head + rowHeight * Double(index)
            out += "<text class=\"tick\" x=\"4\" y=\(quote(y + 15))>\(HTML.escape(cohort))</text>"
            out += "<text class=\"tick\" x=\(quote(left - 8)) y=\(quote(y + 15)) text-anchor=\"end\">\(HTML.escape(installs[index]))</text>"
        }
        for cell in cells {
            guard let value = cell.value else { continue }
            let x = left + dayWidth * Double(cell.day), y = head + rowHeight * Double(cell.row)
            // Shaded by its share of the largest value drawn (a faint tint for 0).
            let opacity = 0.06 + 0.74 * (top > 0 ? max(value, 0) / top : 0)
            let title = "\(cohorts[cell.row]) · D\(Self.days[cell.day]) · revenue per install \(cell.text) \(triangle.layout.query.currency) · retention \(cell.retentionText.isEmpty ? "none" : cell.retentionText)"
            out += "<rect class=\"cell\" x=\(quote(x + 1)) y=\(quote(y + 1)) width=\(quote(dayWidth - 2)) height=\(quote(rowHeight - 2)) fill=\"#2563eb\" fill-opacity=\(quote(opacity))"
            out += " data-cohort=\"\(HTML.escape(cohorts[cell.row]))\" data-day=\"\(Self.days[cell.day])\" data-value=\"\(value)\" data-retention=\"\(cell.retention.map { "\($0)" } ?? "")\">"
            out += "<title>\(HTML.escape(title))</title></rect>"
            out += "<text class=\"cell-text\(opacity > 0.5 ? " dark" : "")\" x=\(quote(x + dayWidth / 2)) y=\(quote(y + 15)) text-anchor=\"middle\">\(HTML.escape(cell.text)) · \(HTML.escape(cell.retentionText))</text>"
        }
        return out + "</svg>"
    }

    func quote(_ value: Double) -> String { "\"\(String(format: "%.1f", value))\"" }

    /// The LTV curves: one line per week of installs over days 0…`curveDays`.
    var curve: SVGChart {
        let categories = (0...Self.curveDays).map { "d\($0)" }
        let labels = (0...Self.curveDays).map { [0, 3, 7, 14, 21, 30].contains($0) ? "D\($0)" : "" }
        let currency = triangle.layout.query.currency
        let series = curves.enumerated().map { index, week -> SVGChart.Series in
            let columns = week.document.layout.columns.map(\.name)
            let cells = week.document.layout.totalCells(week.document.totals, previous: nil)
            var values: [Double?] = [], tips: [String] = []
            for day in 0...Self.curveDays {
                let cell = Self.value(cells[columns.firstIndex(of: "revenue_per_install_d\(day)")!])
                values.append(cell.number)
                tips.append("\(week.label) · D\(day) · revenue per install: \(cell.text.isEmpty ? "none yet" : cell.text + " " + currency)")
            }
            return SVGChart.Series(name: week.label, kind: .line, colour: [0, 6, 1, 8][index % 4], values: values, labels: tips)
        }
        return SVGChart(
            id: "ltv", title: "Revenue per install by day N", categories: categories, categoryLabels: labels, provisional: [],
            leftUnit: .money(currency), leftTitle: "revenue per install \(currency)", series: series
        )
    }
}

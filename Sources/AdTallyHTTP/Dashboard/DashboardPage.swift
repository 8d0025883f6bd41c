import AdTallyCore
import AdTallyStorage
import Foundation

/// The HTML of `/dashboard`: a form to pick the app and range, headline figures,
/// eight charts, and the table they are drawn from. Values and their text come from
/// the report engine's documents (`ReportLayout`'s cells); this draws them.
struct DashboardPage {
    /// The table's metrics; the first charts read them from the same rows.
    static let tableMetrics: [ReportMetric] = [.requests, .impressions, .fillRate, .taps, .ctr, .actionCancels, .cancelRate, .revenue, .ecpm]

    let selection: DashboardRoutes.Selection
    let key: APIKey
    let main: ReportDocument?
    let expiries: ReportDocument?
    let networks: ReportDocument?
    var failure: String?
    /// The range's totals compared with the period before (`compare=previous_period`).
    var summary: ReportDocument?
    /// The app's first day of data (its zone), for what the headline compares with.
    var firstDataDay: Int?
    /// The networks drawn (those with the most revenue, then requests), and whether there are more.
    var topNetworks: [String] = []
    var hasMoreNetworks = false
    /// The audience per period: by day DAU, DAV, engagement, revenue and ARPDAU; by
    /// hour (an hour is no day) active devices and ad viewers.
    var audience: ReportDocument?
    /// The networks' imported reports beside AdTally's counts, by day and network
    /// (DESIGN §11); nil or empty when no network report covers the range.
    var reconciliation: ReconciliationDocument?
    /// Why the reconciliation could not be shown (a missing FX rate).
    var reconciliationFailure: String?
    /// The app's cohorts: the triangle and the LTV curves (DESIGN §13).
    var cohorts: DashboardCohorts?
    /// Why the cohorts could not be shown (a missing FX rate).
    var cohortsFailure: String?
    /// The app's running and recent experiments (DESIGN §14).
    var experiments: DashboardExperiments?
    /// Why they could not be shown.
    var experimentsFailure: String?

    /// The audience metrics the page reads for a grain.
    static func audienceMetrics(_ grain: ReportDimension) -> [ReportMetric] {
        grain == .hour ? [.activeDevices, .adViewers] : [.dau, .dav, .engagementRate, .revenue, .arpdau]
    }

    // MARK: - Rows by category

    /// The page's categories: every day of the range, or every local hour of it (23
    /// or 25 on a DST day, a repeated hour twice), in time order.
    var categories: [String] {
        if selection.grain == .date { return (selection.from...selection.to).map(ReportQuery.formatDate) }
        let zone = main?.layout.query.timezone ?? selection.app.timezone
        var hours = Self.hours(from: selection.from, to: selection.to, zone: zone)
        // An hour a row has that the calendar did not give (it should not happen) is still drawn.
        var known = Set(hours)
        for document in [main, networks, expiries].compactMap({ $0 }) {
            for row in document.rows { if let hour = row.dimensions.first ?? nil, known.insert(hour).inserted { hours.append(hour) } }
        }
        let formatter = ISO8601DateFormatter()
        return hours.map { ($0, formatter.date(from: $0) ?? .distantPast) }.sorted { $0.1 < $1.1 }.map(\.0)
    }

    /// Every local hour from the start of `from` to the end of `to` in a zone, as the
    /// engine names hours (`2026-11-01T01:00:00-04:00`).
    static func hours(from: Int, to: Int, zone: String) -> [String] {
        guard let timeZone = TimeZone(identifier: zone) else { return [] }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        formatter.dateFormat = "yyyy-MM-dd'T'HH:mm:ssxxx"
        func start(_ day: Int) -> Date? {
            let parts = ReportQuery.formatDate(day).split(separator: "-").compactMap { Int($0) }
            guard parts.count == 3 else { return nil }
            return calendar.date(from: DateComponents(year: parts[0], month: parts[1], day: parts[2])).map { calendar.startOfDay(for: $0) }
        }
        guard var instant = start(from), let end = start(to + 1) else { return [] }
        var hours: [String] = []
        var seen = Set<String>()
        // By local wall-clock hours. A zone whose offset moves by half an hour (Lord
        // Howe) does not truncate as PostgreSQL does around its change; an hour the
        // engine names that is not listed here is still drawn (`categories`).
        while instant < end, hours.count < 26 * (to - from + 1) {
            let minutes = calendar.component(.minute, from: instant), seconds = calendar.component(.second, from: instant)
            let hourStart = instant.addingTimeInterval(-Double(minutes * 60 + seconds))
            let text = formatter.string(from: hourStart)
            if seen.insert(text).inserted { hours.append(text) }
            let next = hourStart.addingTimeInterval(3600)
            instant = next > instant ? next : instant.addingTimeInterval(1800)
        }
        return hours
    }

    static func instant(_ hour: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        return formatter.date(from: hour)
    }

    /// Axis labels, "" where none is drawn. Days: at most 8, evenly spaced, with the
    /// year on the first and on 1 January. Hours: each local hour that is a multiple
    /// of a step dividing the day (at most ~8 labels), and the first hour of each date
    /// with its date, wherever the zone's calendar puts it (a skipped midnight, a DST day).
    static func labels(_ categories: [String], grain: ReportDimension) -> [String] {
        guard grain == .hour else {
            let every = max(1, Int((Double(categories.count) / 8).rounded(.up)))
            return categories.enumerated().map { index, day in
                guard index % every == 0 else { return "" }
                return index == 0 || day.hasSuffix("-01-01") ? day : String(day.dropFirst(5))
            }
        }
        let step = [1, 2, 3, 4, 6, 12, 24].first { $0 * 8 >= categories.count } ?? 24
        var previousDate = ""
        return categories.map { hour in
            let date = String(hour.prefix(10)), time = String(hour.dropFirst(11).prefix(5))
            defer { previousDate = date }
            if date != previousDate { return String(date.dropFirst(5)) + " " + time }
            let localHour = Int(hour.dropFirst(11).prefix(2)) ?? 1
            return localHour % step == 0 && hour.dropFirst(14).hasPrefix("00") ? time : ""
        }
    }

    /// A document's rows by category, and by network when it has that dimension.
    struct Rows {
        let document: ReportDocument?
        var byKey: [String: ReportRow] = [:]

        init(_ document: ReportDocument?) {
            self.document = document
            for row in document?.rows ?? [] {
                guard let category = row.dimensions.first ?? nil else { continue }
                let network = row.dimensions.count > 1 ? (row.dimensions[1] ?? "") : ""
                byKey[category + "\u{1}" + network] = row
            }
        }
    }

    /// A metric series over the categories: values to draw and the engine's cell text
    /// for the tooltips (`network` picks one network's rows).
    func series(_ rows: Rows, _ metric: ReportMetric, network: String? = nil, categories: [String]) -> (values: [Double?], labels: [String]) {
        guard let document = rows.document,
              let column = document.layout.columns.firstIndex(where: { $0.name == metric.rawValue }) else { return ([], []) }
        var values: [Double?] = [], labels: [String] = []
        let isCount = metric.valueType == .integer || metric.formula == .money(.revenueMicros)
        for category in categories {
            let title = network.map { "\(category) · \($0)" } ?? category
            if let row = rows.byKey[category + "\u{1}" + (network ?? "")] {
                var number = metric.value(row.counts).number
                if metric.isMoney, let value = number { number = value / 1_000_000 }
                // A percentage for a fraction; an average (DAU) as the number it is.
                let cell = document.layout.cells(row)[column]
                let text = metric.valueType == .number ? ReportText.plain(cell) : Self.text(cell)
                values.append(number)
                labels.append("\(title) · \(metric.rawValue): \(text.isEmpty ? "none" : text)\(metric.isMoney && !text.isEmpty ? " \(document.layout.query.currency)" : "")")
            } else {
                // No events in that period: counts are 0, ratios undefined.
                values.append(isCount ? 0 : nil)
                labels.append("\(title) · \(metric.rawValue): \(isCount ? "0" : "none")")
            }
        }
        return (values, labels)
    }

    // MARK: - Charts

    func charts() -> [SVGChart] {
        let categories = self.categories
        let labels = Self.labels(categories, grain: selection.grain)
        let mainRows = Rows(main), expiryRows = Rows(expiries), networkRows = Rows(networks), audienceRows = Rows(audience)
        let provisionalDays = Set((main?.notes.provisionalDays ?? []).map(ReportQuery.formatDate))
        let provisional = Set(categories.indices.filter { provisionalDays.contains(String(categories[$0].prefix(10))) })
        let currency = main?.layout.query.currency ?? selection.app.currency
        func chart(_ id: String, _ title: String, _ unit: SVGChart.Unit, _ axisTitle: String, right: (SVGChart.Unit, String)? = nil, stacked: Bool = false, _ series: [SVGChart.Series]) -> SVGChart {
            SVGChart(
                id: id, title: title, categories: categories, categoryLabels: labels, provisional: provisional, leftUnit: unit, leftTitle: axisTitle,
                rightUnit: right?.0, rightTitle: right?.1, isStacked: stacked, series: series
            )
        }
        func line(_ rows: Rows, _ metric: ReportMetric, _ name: String, colour: Int, axis: SVGChart.Axis = .left, kind: SVGChart.Kind = .line, network: String? = nil) -> SVGChart.Series {
            let (values, labels) = series(rows, metric, network: network, categories: categories)
            return SVGChart.Series(name: name, kind: kind, axis: axis, colour: colour, values: values, labels: labels)
        }
        let networkNames = topNetworks
        return [
            chart("inventory", "Inventory and impressions", .count, "requests, impressions", [
                line(mainRows, .requests, "requests", colour: 0), line(mainRows, .impressions, "impressions", colour: 1),
            ]),
            chart("fill-rate", "Fill rate (impressions / requests)", .percent, "fill rate %", [line(mainRows, .fillRate, "fill rate", colour: 1)]),
            chart("taps", "Taps and cancel rate", .count, "taps", right: (.percent, "cancel rate %"), [
                line(mainRows, .taps, "taps", colour: 2, kind: .bar), line(mainRows, .cancelRate, "cancel rate", colour: 3, axis: .right),
            ]),
            // Wasted fills are the unshown part of all expiries: drawn over the whole bar from the baseline.
            chart("expiries", "Interstitial expiries: shown and never shown", .count, "expiries", [
                line(expiryRows, .expiries, "all expiries (top part: shown)", colour: 4, kind: .bar),
                line(expiryRows, .wastedFills, "never shown (wasted fills)", colour: 3, kind: .bar),
            ]),
            chart("revenue", "Revenue by network", .money(currency), "revenue \(currency)", stacked: true,
                  networkNames.enumerated().map { index, name in line(networkRows, .revenue, name, colour: 5 + index, kind: .bar, network: name) }),
            chart("ecpm", "eCPM by network", .money(currency), "eCPM \(currency)",
                  networkNames.enumerated().map { index, name in line(networkRows, .ecpm, name, colour: 5 + index, network: name) }),
        ] + (selection.grain == .hour ? [
            chart("audience", "Active devices and ad viewers per hour", .count, "devices", [
                line(audienceRows, .activeDevices, "active devices", colour: 0), line(audienceRows, .adViewers, "ad viewers", colour: 1),
            ]),
        ] : [
            chart("audience", "Daily active devices (DAU), ad viewers (DAV) and engagement (DAV / DAU)", .count, "devices", right: (.percent, "engagement %"), [
                line(audienceRows, .dau, "DAU", colour: 0), line(audienceRows, .dav, "DAV", colour: 1),
                line(audienceRows, .engagementRate, "engagement rate", colour: 3, axis: .right),
            ]),
            chart("arpdau", "Revenue and ARPDAU (revenue per daily active device)", .money(currency), "revenue \(currency)", right: (.money(currency), "ARPDAU \(currency)"), [
                line(audienceRows, .revenue, "revenue", colour: 5, kind: .bar), line(audienceRows, .arpdau, "ARPDAU", colour: 2, axis: .right),
            ]),
        ])
    }

    // MARK: - HTML

    func html() -> String {
        let app = selection.app
        var body = "<header><h1>AdTally</h1><form class=\"pick\" method=\"get\" action=\"/dashboard\">"
        body += "<label>App <select name=\"app\" id=\"app\">"
        for candidate in selection.apps {
            body += "<option value=\"\(HTML.escape(candidate.id))\"\(candidate.id == app.id ? " selected" : "")>\(HTML.escape(candidate.id))</option>"
        }
        body += "</select></label>"
        body += "<label>From <input type=\"date\" name=\"from\" value=\"\(ReportQuery.formatDate(selection.from))\"></label>"
        body += "<label>To <input type=\"date\" name=\"to\" value=\"\(ReportQuery.formatDate(selection.to))\"></label>"
        body += "<button type=\"submit\">Show</button>"
        for days in [1, 7, 28, 90] {
            let from = ReportQuery.formatDate(selection.today - days + 1), to = ReportQuery.formatDate(selection.today)
            body += "<a class=\"quick\" href=\"/dashboard?app=\(Self.urlEncode(app.id))&amp;from=\(from)&amp;to=\(to)\">\(days == 1 ? "today" : "\(days) days")</a>"
        }
        body += "</form><form method=\"post\" action=\"/dashboard/logout\" class=\"logout\"><span>\(HTML.escape(key.scope.rawValue)) key \(HTML.escape(key.id))</span><button type=\"submit\">Sign out</button></form></header>"
        body += "<main>"
        if let problem = selection.problem { body += "<p class=\"error\" role=\"alert\">\(HTML.escape(problem))</p>" }
        let zone = main?.layout.query.timezone ?? app.timezone
        body += "<p class=\"context\"><strong>\(HTML.escape(app.id))</strong> · \(ReportQuery.formatDate(selection.from)) to \(ReportQuery.formatDate(selection.to)) · "
        body += "\(selection.grain == .hour ? "hours" : "days") in <strong>\(HTML.escape(zone))</strong> (the app's zone) · money in \(HTML.escape(main?.layout.query.currency ?? app.currency))</p>"
        if let failure {
            body += "<p class=\"error\" role=\"alert\">\(HTML.escape(failure))</p></main>"
            return Self.document(title: "AdTally · \(app.id)", body: body)
        }
        if let main {
            body += tiles(main)
            body += notes(main)
        }
        body += "<section class=\"charts\">"
        for chart in charts() {
            body += "<figure><figcaption>\(HTML.escape(chart.title))</figcaption>\(chart.svg())\(legend(chart))</figure>"
        }
        body += "</section>"
        if let cohorts { body += cohorts.html() }
        if let cohortsFailure {
            body += "<section class=\"cohorts\"><h2>Cohorts</h2><p class=\"error\" role=\"alert\">\(HTML.escape(cohortsFailure))</p></section>"
        }
        if let experiments { body += experiments.html() }
        if let experimentsFailure {
            body += "<section class=\"experiments\"><h2>Experiments</h2><p class=\"error\" role=\"alert\">\(HTML.escape(experimentsFailure))</p></section>"
        }
        if let main { body += table(main) }
        body += reconciliationTables()
        body += "</main>"
        return Self.document(title: "AdTally · \(app.id)", body: body)
    }

    /// A cell as people read it: the engine's text, ratios as percentages.
    static func text(_ cell: ReportCell) -> String {
        if case .ratio(let value) = cell { return String(format: "%.1f%%", value * 100) }
        return ReportText.plain(cell)
    }

    /// The headline totals; with `summary`, each against the same number of days before.
    func tiles(_ document: ReportDocument) -> String {
        let source = summary ?? document
        let isCompared = source.layout.query.comparison != nil
        let cells = source.layout.totalCells(source.totals, previous: isCompared ? source.previousTotals : nil)
        let stride = isCompared ? 3 : 1
        let days = selection.to - selection.from + 1
        // Days before the app's first data are not zeros to compare with: a change against
        // a period that is partly before it would be the growth of the data, not the app.
        let earlierStart = selection.from - days
        let noEarlierData = firstDataDay.map { $0 > earlierStart } ?? true
        var out = "<section class=\"tiles\">"
        for (index, metric) in source.layout.query.metrics.enumerated() where index * stride < cells.count {
            var text = Self.text(cells[index * stride])
            if metric.isMoney, !text.isEmpty { text += " " + source.layout.query.currency }
            out += "<div class=\"tile\" data-metric=\"\(metric.rawValue)\"><span class=\"name\">\(metric.rawValue.replacingOccurrences(of: "_", with: " "))</span><span class=\"value\">\(HTML.escape(text.isEmpty ? "–" : text))</span>"
            if isCompared, noEarlierData {
                let since = firstDataDay.map { " (its data starts \(ReportQuery.formatDate($0)))" } ?? ""
                out += "<span class=\"change same\" title=\"\(HTML.escape(selection.app.id))\(HTML.escape(since))\">no earlier data to compare: the \(days) days before begin before the app's first data</span>"
            } else if isCompared, index * stride + 2 < cells.count {
                let before = Self.text(cells[index * stride + 1])
                if case .ratio(let change) = cells[index * stride + 2] {
                    let sign = change > 0 ? "▲ +" : change < 0 ? "▼ " : "= "
                    out += "<span class=\"change \(change > 0 ? "up" : change < 0 ? "down" : "same")\" title=\"the \(days) days before: \(HTML.escape(before))\">\(sign)\(String(format: "%.1f%%", change * 100)) vs the \(days) days before</span>"
                } else {
                    out += "<span class=\"change same\">nothing to compare in the \(days) days before</span>"
                }
            }
            out += "</div>"
        }
        return out + "</section>"
    }

    func notes(_ document: ReportDocument) -> String {
        var items: [String] = []
        let provisional = document.notes.provisionalDays
        if let first = provisional.first, let last = provisional.last {
            let days = first == last ? ReportQuery.formatDate(first) : "\(ReportQuery.formatDate(first)) to \(ReportQuery.formatDate(last))"
            items.append("<span class=\"swatch provisional\"></span>Provisional (shaded): \(days) — late events may still arrive and change them.")
        }
        for length in document.notes.dayLengths {
            items.append("\(ReportQuery.formatDate(length.day)) had \(ReportText.ratio(length.hours)) hours in \(HTML.escape(document.layout.query.timezone)).")
        }
        if hasMoreNetworks {
            items.append("Revenue and eCPM by network draw the \(topNetworks.count) networks with the most revenue; the others are in the totals and the table.")
        }
        if document.totals.estimatedMicros > 0 {
            items.append("Revenue includes amounts estimated from the rate card (\(ReportText.plain(.money(micros: document.totals.estimatedMicros, per: 1, digits: Money.digits(document.layout.query.currency)))) \(HTML.escape(document.layout.query.currency))).")
        }
        // The revenue of record (DESIGN §11): which days are a network's final earnings.
        for line in document.notes.revenueOfRecord { items.append(HTML.escape(line) + ".") }
        if document.totals.unratedEvents > 0 {
            items.append("\(document.totals.unratedEvents) impressions or taps had neither reported revenue nor a rate card entry, so no revenue.")
        }
        let readFrom = document.notes.readFrom
        if readFrom.isWorthNoting {
            items.append("Read from the \(HTML.escape(readFrom.text)).")
        }
        guard !items.isEmpty else { return "" }
        return "<ul class=\"notes\">" + items.map { "<li>\($0)</li>" }.joined() + "</ul>"
    }

    func legend(_ chart: SVGChart) -> String {
        var out = "<ul class=\"legend\">"
        for series in chart.series {
            out += "<li><span class=\"swatch c\(series.colour)\"></span>\(HTML.escape(series.name))\(series.axis == .right ? " (right axis)" : "")</li>"
        }
        if !chart.provisional.isEmpty { out += "<li><span class=\"swatch provisional\"></span>provisional</li>" }
        if chart.series.isEmpty { out += "<li>no network reported anything in this range</li>" }
        return out + "</ul>"
    }

    func table(_ document: ReportDocument) -> String {
        let layout = document.layout
        let csv = "/dashboard/report.csv?app=\(Self.urlEncode(selection.app.id))&amp;from=\(ReportQuery.formatDate(selection.from))&amp;to=\(ReportQuery.formatDate(selection.to))"
        var out = "<section class=\"table\"><h2>By \(selection.grain == .hour ? "hour" : "day") <a class=\"download\" href=\"\(csv)\" download>Download CSV</a></h2><table><thead><tr>"
        for (index, column) in layout.columns.enumerated() {
            out += "<th class=\"\(index < layout.query.dimensions.count ? "text" : "num")\">\(HTML.escape(column.name))</th>"
        }
        out += "</tr></thead><tbody>"
        let provisional = Set(document.notes.provisionalDays.map(ReportQuery.formatDate))
        for row in document.rows {
            let category = (row.dimensions.first ?? nil) ?? ""
            out += "<tr data-cat=\"\(HTML.escape(category))\"\(provisional.contains(String(category.prefix(10))) ? " class=\"provisional\"" : "")>"
            for (index, cell) in layout.cells(row).enumerated() {
                out += "<td class=\"\(index < layout.query.dimensions.count ? "text" : "num")\">\(HTML.escape(Self.text(cell)))</td>"
            }
            out += "</tr>"
        }
        out += "</tbody><tfoot><tr><th class=\"text\">total</th>"
        for cell in layout.totalCells(document.totals, previous: nil) { out += "<td class=\"num\">\(HTML.escape(Self.text(cell)))</td>" }
        out += "</tr></tfoot></table></section>"
        return out
    }

    static let reconciledCounts = ReconciliationDocument.metricColumns.firstIndex { $0.name == "flagged" }!

    /// A table per network with an imported report: each day AdTally's and the
    /// network's impressions, clicks and revenue, the discrepancies, flagged rows marked.
    func reconciliationTables() -> String {
        if let reconciliationFailure {
            return "<section class=\"table reconciliation\"><h2>Against the networks' reports</h2><p class=\"error\">\(HTML.escape(reconciliationFailure))</p></section>"
        }
        guard let document = reconciliation, !document.rows.isEmpty,
              let dateColumn = document.query.report.dimensions.firstIndex(of: .date),
              let networkColumn = document.query.report.dimensions.firstIndex(of: .network) else { return "" }
        let names = ["date", "ours impressions", "network impressions", "impressions Δ %", "ours clicks", "network clicks", "clicks Δ %",
                     "ours revenue", "network revenue", "revenue Δ %", "status"]
        var out = ""
        for network in document.networks {
            let rows = document.rows.filter { $0.dimensions[networkColumn] == network.name }
            guard !rows.isEmpty else { continue }
            let flagged = rows.filter(\.isFlagged).count
            out += "<section class=\"table reconciliation\" data-network=\"\(HTML.escape(network.name))\"><h2>\(HTML.escape(network.name)) against its report"
            out += " <span class=\"muted\">days in \(HTML.escape(network.zone)), flagged beyond \(ReportText.ratio(network.tolerancePct)) %"
            out += flagged > 0 ? ", \(flagged) flagged" : ""
            out += "</span></h2><table><thead><tr>"
            for (index, name) in names.enumerated() { out += "<th class=\"\(index == 0 || index == names.count - 1 ? "text" : "num")\">\(HTML.escape(name))</th>" }
            out += "</tr></thead><tbody>"
            for row in rows {
                let cells = document.cells(row)
                // The counts and discrepancies: the metric columns before `flagged`.
                let metrics = Array(cells[document.query.report.dimensions.count...].prefix(Self.reconciledCounts))
                let status = row.theirs == nil ? "not reported" : row.isFlagged ? "⚑ flagged" : row.isFinal ? "ok" : "ok, not final"
                out += "<tr\(row.isFlagged ? " class=\"flagged\"" : row.isFinal ? "" : " class=\"provisional\"")>"
                out += "<td class=\"text\">\(HTML.escape(row.dimensions[dateColumn] ?? ""))</td>"
                for cell in metrics { out += "<td class=\"num\">\(HTML.escape(ReportText.plain(cell)))</td>" }
                out += "<td class=\"text\">\(status)</td></tr>"
            }
            out += "</tbody></table></section>"
        }
        return out
    }

    static func urlEncode(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? ""
    }

    static func document(title: String, body: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(HTML.escape(title))</title><link rel="icon" href="/dashboard/assets/icon.svg"><link rel="stylesheet" href="/dashboard/assets/dashboard.css"><script src="/dashboard/assets/dashboard.js" defer></script></head>
        <body>\(body)</body></html>
        """
    }

    /// The page of a key that may read no app yet.
    static func noApps(key: APIKey) -> String {
        var body = "<header><h1>AdTally</h1><form method=\"post\" action=\"/dashboard/logout\" class=\"logout\"><span>\(HTML.escape(key.scope.rawValue)) key \(HTML.escape(key.id))</span><button type=\"submit\">Sign out</button></form></header>"
        body += "<main><p class=\"error\" role=\"alert\">There is no app to show yet. Create one with <code>adtally apps create</code> (or <code>POST /v1/apps</code>), or load the demo with <code>adtally demo</code>.</p></main>"
        return document(title: "AdTally", body: body)
    }

    /// The sign-in form; `message` says why the last attempt failed, `next` is the
    /// query of the page asked for, to return to.
    static func login(message: String?, next: String? = nil) -> String {
        var body = "<main class=\"login\"><h1>AdTally</h1><form method=\"post\" action=\"/dashboard/login\">"
        if let next { body += "<input type=\"hidden\" name=\"next\" value=\"\(HTML.escape(next))\">" }
        body += "<label for=\"key\">Read or admin key</label><input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"off\" required placeholder=\"atk_…\">"
        if let message { body += "<p class=\"error\" role=\"alert\">\(HTML.escape(message))</p>" }
        body += "<button type=\"submit\">Sign in</button><p class=\"hint\">The key is exchanged for a session cookie and kept nowhere else. "
        body += "Make one with <code>adtally keys create --app APP --scope read</code>.</p></form></main>"
        return document(title: "AdTally · sign in", body: body)
    }

    // MARK: - Assets

    static let icon = """
        <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect x="1" y="9" width="3" height="6" fill="#2563eb"/><rect x="6" y="5" width="3" height="10" fill="#16a34a"/><rect x="11" y="1" width="3" height="14" fill="#f59e0b"/></svg>
        """

    static let styleSheet = """
        :root { --fg: #1f2933; --muted: #616e7c; --line: #d9dee4; --bg: #f7f8fa; --card: #fff;
          font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); }
        body { margin: 0; }
        header { display: flex; flex-wrap: wrap; align-items: center; gap: 12px 24px; padding: 10px 20px; background: var(--card); border-bottom: 1px solid var(--line); }
        header h1 { font-size: 18px; margin: 0; }
        form.pick { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 12px; }
        form.pick label { font-size: 13px; color: var(--muted); }
        a.quick { font-size: 13px; color: #2563eb; }
        form.logout { margin-left: auto; font-size: 12px; color: var(--muted); display: flex; gap: 8px; align-items: center; }
        main { padding: 12px 20px 40px; max-width: 1400px; }
        .context { margin: 4px 0 12px; color: var(--muted); }
        .error { color: #b42318; background: #fef3f2; padding: 8px 12px; border-radius: 6px; }
        .tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; }
        .tile { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; display: flex; flex-direction: column; }
        .tile .name { font-size: 12px; color: var(--muted); }
        .tile .value { font-size: 20px; font-variant-numeric: tabular-nums; }
        .tile .change { font-size: 11px; color: var(--muted); } .tile .change.up { color: #15803d; } .tile .change.down { color: #b42318; }
        ul.notes { color: var(--muted); font-size: 13px; padding-left: 18px; }
        .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; margin-top: 12px; }
        figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px; }
        figcaption { font-weight: 600; font-size: 14px; margin-bottom: 4px; }
        svg.chart { width: 100%; height: auto; display: block; }
        svg .grid { stroke: #eef0f3; }
        svg .axis { stroke: #9aa5b1; }
        svg .tick, svg .axis-title { font-size: 11px; fill: var(--muted); }
        svg rect.provisional { fill: #f1f3f6; }
        svg path.line { fill: none; stroke-width: 2; }
        svg .mark:hover, svg .mark.lit { stroke: #111; stroke-width: 1.5; }
        ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 14px; padding: 0; margin: 6px 0 0; font-size: 12px; color: var(--muted); }
        .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
        .swatch.provisional { background: #e4e7eb; }
        .c0 { --c: #2563eb; } .c1 { --c: #16a34a; } .c2 { --c: #7c3aed; } .c3 { --c: #dc2626; } .c4 { --c: #0891b2; }
        .c5 { --c: #2563eb; } .c6 { --c: #f59e0b; } .c7 { --c: #16a34a; } .c8 { --c: #db2777; } .c9 { --c: #7c3aed; } .c10 { --c: #64748b; }
        .c11 { --c: #0d9488; } .c12 { --c: #a16207; }
        rect.mark, circle.mark { fill: var(--c); } path.line { stroke: var(--c); } .swatch[class*=" c"] { background: var(--c); }
        section.table { margin-top: 18px; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px; overflow-x: auto; }
        section.table h2 { font-size: 15px; margin: 0 0 8px; display: flex; gap: 12px; align-items: baseline; }
        a.download { font-size: 13px; font-weight: normal; }
        table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; width: 100%; }
        th, td { padding: 4px 8px; border-bottom: 1px solid #eef0f3; white-space: nowrap; }
        th.num, td.num { text-align: right; } th.text, td.text { text-align: left; }
        tr.provisional td { color: var(--muted); font-style: italic; }
        tr.flagged td { background: #fef3f2; color: #b42318; }
        .muted { color: var(--muted); font-size: 13px; font-weight: normal; }
        tr.lit td { background: #fff7d6; }
        main.login { max-width: 360px; margin: 12vh auto; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 20px 24px; }
        main.login form { display: flex; flex-direction: column; gap: 10px; }
        main.login .hint { font-size: 12px; color: var(--muted); }
        button { font: inherit; padding: 4px 12px; }
        section.cohorts { margin-top: 18px; }
        section.cohorts h2 { font-size: 15px; margin: 0 0 8px; display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
        .cohort-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; }
        .cohort-grid figure.triangle { grid-column: 1 / -1; } figure.triangle svg { max-width: 1100px; }
        svg.cohorts { width: 100%; height: auto; display: block; }
        svg .cell-text { font-size: 10.5px; fill: var(--fg); font-variant-numeric: tabular-nums; } svg .cell-text.dark { fill: #fff; }
        svg rect.cell:hover { stroke: #111; stroke-width: 1.5; }
        section.experiments { margin-top: 18px; }
        section.experiments h2 { font-size: 15px; margin: 0 0 8px; display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
        .experiment h3 { font-size: 14px; margin: 12px 0 4px; }
        p.verdict { margin: 4px 0 10px; padding: 6px 10px; border-radius: 6px; background: #f1f5f9; }
        p.verdict.decided { background: #ecfdf3; color: #14532d; } p.verdict.broken { background: #fef3f2; color: #b42318; }
        svg line.interval { stroke: var(--c); stroke-width: 2; } svg polygon.band { fill: var(--c); fill-opacity: 0.15; stroke: none; }
        figure.lift { margin-top: 14px; } figure.lift svg { max-width: 760px; }
        """

    /// Interactions only (the charts need no script): picking an app shows it, and
    /// hovering a chart's mark lights its row in the table.
    static let script = """
        "use strict";
        document.addEventListener("DOMContentLoaded", () => {
          const app = document.getElementById("app");
          if (app) app.addEventListener("change", () => app.form.submit());
          const rows = new Map();
          document.querySelectorAll("tr[data-cat]").forEach((row) => rows.set(row.dataset.cat, row));
          document.querySelectorAll("svg.chart .mark").forEach((mark) => {
            const row = rows.get(mark.dataset.cat);
            if (!row) return;
            mark.addEventListener("mouseenter", () => row.classList.add("lit"));
            mark.addEventListener("mouseleave", () => row.classList.remove("lit"));
          });
        });
        """
}

import Foundation

/// A chart of values over time categories (days or hours), drawn as SVG on the
/// server: bars and lines, one or two value axes, the provisional periods shaded.
/// It draws what it is given and computes no metric: values come from the report
/// engine, tooltips are the engine's own cell text.
///
/// Every drawn value is one element with class `mark` (a bar's `rect`, a line
/// point's `circle`) carrying `data-series`, `data-cat` and `data-value`: the
/// browser test checks them against the report API, and the page's script lights
/// the table row of a hovered mark.
struct SVGChart {
    /// How a series is drawn.
    enum Kind { case bar, line }
    /// Which value axis a series reads against.
    enum Axis { case left, right }
    /// How an axis labels its values.
    enum Unit: Equatable {
        case count
        case percent
        case money(String)

        var title: String {
            switch self {
            case .count: "count"
            case .percent: "%"
            case .money(let currency): currency
            }
        }
    }

    /// One series: a value (nil: none, e.g. a ratio over 0) and its tooltip per category.
    struct Series {
        var name: String
        var kind: Kind
        var axis: Axis = .left
        /// Colour class (`c0` …) from the page's style sheet.
        var colour: Int
        var values: [Double?]
        var labels: [String]
    }

    /// The chart's `data-chart` name.
    var id: String
    var title: String
    /// Category keys (`YYYY-MM-DD` or an hour with its offset) and their axis labels
    /// (empty: no label there).
    var categories: [String]
    var categoryLabels: [String]
    /// Categories still provisional (late events may change them).
    var provisional: Set<Int>
    var leftUnit: Unit
    var leftTitle: String
    var rightUnit: Unit?
    var rightTitle: String?
    /// Bars of several series stack (each on the one before); else they overlap, later in front.
    var isStacked = false
    var series: [Series]

    static let width = 640.0, height = 250.0
    static let top = 14.0, bottom = 40.0, left = 62.0

    var right: Double { rightUnit == nil ? 16 : 62 }
    var plotWidth: Double { Self.width - Self.left - right }
    var plotHeight: Double { Self.height - Self.top - Self.bottom }

    /// The SVG element.
    func svg() -> String {
        var out = """
            <svg class="chart" data-chart="\(HTML.escape(id))" viewBox="0 0 \(Int(Self.width)) \(Int(Self.height))" role="img" aria-label="\(HTML.escape(title))" xmlns="http://www.w3.org/2000/svg">
            """
        out += "<title>\(HTML.escape(title))</title>"
        let count = max(categories.count, 1)
        let band = plotWidth / Double(count)
        // Provisional periods first, under everything else.
        for index in provisional.sorted() where index < categories.count {
            out += "<rect class=\"provisional\" x=\"\(f(Self.left + band * Double(index)))\" y=\"\(f(Self.top))\" width=\"\(f(band))\" height=\"\(f(plotHeight))\"><title>provisional: late events may still change \(HTML.escape(categories[index]))</title></rect>"
        }
        let leftMax = Self.niceCeiling(axisMaximum(.left))
        let rightMax = Self.niceCeiling(axisMaximum(.right))
        // Grid and left axis.
        for step in 0...4 {
            let value = leftMax * Double(step) / 4
            let y = Self.top + plotHeight - plotHeight * Double(step) / 4
            out += "<line class=\"grid\" x1=\"\(f(Self.left))\" x2=\"\(f(Self.left + plotWidth))\" y1=\"\(f(y))\" y2=\"\(f(y))\"/>"
            out += "<text class=\"tick\" x=\"\(f(Self.left - 6))\" y=\"\(f(y + 4))\" text-anchor=\"end\">\(HTML.escape(Self.tick(value, leftUnit)))</text>"
            if let rightUnit {
                out += "<text class=\"tick\" x=\"\(f(Self.left + plotWidth + 6))\" y=\"\(f(y + 4))\">\(HTML.escape(Self.tick(rightMax * Double(step) / 4, rightUnit)))</text>"
            }
        }
        out += "<text class=\"axis-title\" transform=\"translate(12 \(f(Self.top + plotHeight / 2))) rotate(-90)\" text-anchor=\"middle\">\(HTML.escape(leftTitle))</text>"
        if let rightTitle {
            out += "<text class=\"axis-title\" transform=\"translate(\(f(Self.width - 8)) \(f(Self.top + plotHeight / 2))) rotate(90)\" text-anchor=\"middle\">\(HTML.escape(rightTitle))</text>"
        }
        out += "<line class=\"axis\" x1=\"\(f(Self.left))\" x2=\"\(f(Self.left + plotWidth))\" y1=\"\(f(Self.top + plotHeight))\" y2=\"\(f(Self.top + plotHeight))\"/>"
        for index in categoryLabels.indices where index < categories.count && !categoryLabels[index].isEmpty {
            let x = Self.left + band * (Double(index) + 0.5)
            out += "<text class=\"tick\" x=\"\(f(x))\" y=\"\(f(Self.top + plotHeight + 16))\" text-anchor=\"middle\">\(HTML.escape(categoryLabels[index]))</text>"
        }
        // Bars, then lines over them.
        var stackBase = [Double](repeating: 0, count: categories.count)
        for series in self.series where series.kind == .bar {
            let maximum = series.axis == .left ? leftMax : rightMax
            let barWidth = band * 0.72
            for (index, value) in series.values.enumerated() where index < categories.count {
                guard let value else { continue }
                let base = isStacked ? stackBase[index] : 0
                // A value above 0 stays visible (half a pixel at least) however small
                // beside the axis maximum: a new day's first minutes of revenue, say.
                let y0 = scale(base, maximum), y1 = value > 0 ? min(scale(base + value, maximum), y0 - 0.5) : y0
                if isStacked { stackBase[index] += max(value, 0) }
                let x = Self.left + band * Double(index) + (band - barWidth) / 2
                out += "<rect class=\"mark c\(series.colour)\" data-series=\"\(HTML.escape(series.name))\" data-cat=\"\(HTML.escape(categories[index]))\" data-value=\"\(value)\" x=\"\(f(x))\" y=\"\(f(y1))\" width=\"\(f(barWidth))\" height=\"\(f(max(y0 - y1, 0)))\"><title>\(HTML.escape(series.labels[index]))</title></rect>"
            }
        }
        for series in self.series where series.kind == .line {
            let maximum = series.axis == .left ? leftMax : rightMax
            var path = ""
            var points = ""
            var isDrawing = false
            for (index, value) in series.values.enumerated() where index < categories.count {
                guard let value else {
                    isDrawing = false  // a gap: no value (a ratio over nothing) is not zero
                    continue
                }
                let x = Self.left + band * (Double(index) + 0.5), y = scale(value, maximum)
                path += "\(isDrawing ? "L" : "M")\(f(x)) \(f(y))"
                isDrawing = true
                points += "<circle class=\"mark c\(series.colour)\" data-series=\"\(HTML.escape(series.name))\" data-cat=\"\(HTML.escape(categories[index]))\" data-value=\"\(value)\" cx=\"\(f(x))\" cy=\"\(f(y))\" r=\"\(categories.count > 60 ? 1.8 : 3)\"><title>\(HTML.escape(series.labels[index]))</title></circle>"
            }
            if !path.isEmpty { out += "<path class=\"line c\(series.colour)\" d=\"\(path)\"/>" }
            out += points
        }
        out += "</svg>"
        return out
    }

    /// The largest value an axis must show (stacked bars: the tallest stack).
    func axisMaximum(_ axis: Axis) -> Double {
        var maximum = 0.0
        var stacks = [Double](repeating: 0, count: categories.count)
        for series in self.series where series.axis == axis {
            for (index, value) in series.values.enumerated() where index < categories.count {
                guard let value, value.isFinite else { continue }
                if isStacked && series.kind == .bar {
                    stacks[index] += max(value, 0)
                    maximum = max(maximum, stacks[index])
                } else {
                    maximum = max(maximum, value)
                }
            }
        }
        return maximum
    }

    func scale(_ value: Double, _ maximum: Double) -> Double {
        Self.top + plotHeight - (maximum > 0 ? plotHeight * min(value, maximum) / maximum : 0)
    }

    /// The smallest of 1, 1.2, 1.6, 2, 4, 6, 8 × 10^n at or above `value` (1 for
    /// nothing): their quarters (0.25, 0.3, 0.4, 0.5, 1, 1.5, 2) make round ticks.
    static func niceCeiling(_ value: Double) -> Double {
        guard value > 0, value.isFinite else { return 1 }
        let magnitude = pow(10, floor(log10(value)))
        for step in [1.0, 1.2, 1.6, 2, 4, 6, 8, 10] where step * magnitude >= value * (1 - 1e-12) { return step * magnitude }
        return 10 * magnitude
    }

    /// A tick label: counts and money compact (1.2k, 3.4M), ratios as percent.
    static func tick(_ value: Double, _ unit: Unit) -> String {
        switch unit {
        case .percent:
            let percent = value * 100
            return abs(percent - percent.rounded()) < 1e-9 ? "\(Int(percent.rounded()))%" : String(format: "%.1f%%", percent)
        case .count, .money:
            let magnitude = abs(value)
            let (scaled, suffix): (Double, String) = magnitude >= 1e9 ? (value / 1e9, "G") : magnitude >= 1e6 ? (value / 1e6, "M") : magnitude >= 1e3 ? (value / 1e3, "k") : (value, "")
            if abs(scaled - scaled.rounded()) < 1e-9 { return "\(Int(scaled.rounded()))\(suffix)" }
            // Below 1, four decimals: money per install is cents and less (0.0025).
            return String(format: abs(scaled) >= 10 ? "%.1f" : abs(scaled) >= 1 ? "%.2f" : "%.4f", scaled).replacingOccurrences(of: #"\.?0+$"#, with: "", options: .regularExpression) + suffix
        }
    }

    func f(_ value: Double) -> String { String(format: "%.1f", value) }
}

/// HTML text escaping.
enum HTML {
    /// Escapes text for an element's content or a quoted attribute.
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text.unicodeScalars {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(character)
            }
        }
        return out
    }
}

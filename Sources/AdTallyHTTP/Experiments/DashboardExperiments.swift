import AdTallyCore
import AdTallyStorage
import Foundation
import Logging

/// The dashboard's experiments (DESIGN §14): for the app's running experiments and those
/// stopped in the range (the newest three), both arms' ARPDAU by day with its interval
/// bars and cumulative with its band, the ARPDAU lift with its interval, and the verdict.
/// Every number is the engine's (`ReportEngine.experimentResults`), as `GET
/// /v1/apps/{app}/experiments/{name}/results` answers it; each drawn value is a `.mark`
/// with `data-series`, `data-cat`, `data-value`, `data-low` and `data-high`, which the
/// browser test checks against that API.
struct DashboardExperiments {
    /// The most experiments drawn.
    static let maxShown = 3

    let results: [ExperimentResults]
    /// Experiments whose results could not be read, and why (each said in its place).
    var failures: [(name: String, reason: String)] = []

    /// The experiments to show: running ones, and those stopped on or after the range's first day.
    static func load(engine: ReportEngine, selection: DashboardRoutes.Selection) async throws -> DashboardExperiments? {
        let store = ExperimentStore(pool: engine.reads.primary)
        let rangeStart = Date(timeIntervalSince1970: Double(selection.from - 1) * 86_400)
        let shown = try await store.list(app: selection.app.id)
            .filter { $0.status == "running" || ($0.stoppedAt ?? .distantPast) >= rangeStart }
            .prefix(maxShown)
        guard !shown.isEmpty else { return nil }
        var results: [ExperimentResults] = []
        var failures: [(name: String, reason: String)] = []
        for experiment in shown {
            // One experiment's failure (an old one's missing FX rate) hides only it.
            do {
                results.append(try await engine.experimentResults(experiment, app: selection.app))
            } catch let error as ReportCurrencyError {
                failures.append((experiment.name, error.description))
            } catch {
                Logger(label: "adtally.dashboard").warning("experiment results not shown", metadata: ["app": "\(experiment.app)", "experiment": "\(experiment.name)", "error": "\(error)"])
                failures.append((experiment.name, "its results could not be read now (the server's log says why)"))
            }
        }
        return DashboardExperiments(results: results, failures: failures)
    }

    func html() -> String {
        var out = "<section class=\"experiments\"><h2>Experiments <span class=\"muted\">ARPDAU per arm with 95 % intervals (the device as the unit) · "
        out += "a lift is a win only when its whole interval is above 0 · docs/experiments.md</span></h2>"
        for result in results { out += section(result) }
        for failure in failures {
            out += "<div class=\"experiment\"><h3>\(HTML.escape(failure.name))</h3><p class=\"error\" role=\"alert\">\(HTML.escape(failure.reason))</p></div>"
        }
        return out + "</section>"
    }

    func section(_ r: ExperimentResults) -> String {
        let e = r.experiment
        let currency = r.currency
        var out = "<div class=\"experiment\" data-experiment=\"\(HTML.escape(e.name))\">"
        out += "<h3>\(HTML.escape(e.name)) <span class=\"muted\">placement \(HTML.escape(e.placement)) · control \(HTML.escape(e.control.spec)) · "
        out += "treatment \(HTML.escape(e.treatment.spec)) on \(e.treatmentShare)% · \(HTML.escape(e.status))\(e.isAA ? " · A/A test" : "")</span></h3>"
        let verdictClass = r.sampleRatio.isBroken ? "verdict broken" : r.winner != nil ? "verdict decided" : "verdict"
        out += "<p class=\"\(verdictClass)\" data-winner=\"\(r.winner?.rawValue ?? "")\">\(HTML.escape(r.verdict))</p>"
        out += "<div class=\"cohort-grid\">"
        out += "<figure><figcaption>ARPDAU by day (\(HTML.escape(currency))), with 95 % intervals</figcaption>\(dailySVG(r, cumulative: false))\(legend)</figure>"
        out += "<figure><figcaption>ARPDAU cumulative since exposure (\(HTML.escape(currency))), with 95 % bands</figcaption>\(dailySVG(r, cumulative: true))\(legend)</figure>"
        out += "</div>"
        out += liftSVG(r)
        let devices = ExperimentArm.allCases.map { "\($0.rawValue) \(Int(r.moments[$0]?.n ?? 0)) devices" }.joined(separator: ", ")
        out += "<p class=\"muted\">\(devices) · sample ratio χ² \(String(format: "%.2f", r.sampleRatio.chi2)), p \(String(format: "%.3g", r.sampleRatio.p))"
        out += r.sampleRatio.isBroken ? " — broken split" : ""
        out += " · \(r.wholeDays) whole days\(r.partialDay ? ", today's partial day included" : "")</p>"
        return out + "</div>"
    }

    var legend: String {
        "<ul class=\"legend\"><li><span class=\"swatch c0\"></span>control</li><li><span class=\"swatch c6\"></span>treatment</li></ul>"
    }

    static let width = 640.0, height = 230.0, top = 14.0, bottom = 36.0, left = 70.0, right = 16.0

    func f(_ value: Double) -> String { String(format: "%.1f", value) }

    /// Each arm's daily (points with interval bars) or cumulative (line with a band) ARPDAU.
    func dailySVG(_ r: ExperimentResults, cumulative: Bool) -> String {
        let id = (cumulative ? "experiment-cumulative:" : "experiment-daily:") + r.experiment.name
        let days = r.days
        let estimate = { (day: ExperimentResults.Day, arm: ExperimentArm) -> Estimate? in cumulative ? day.cumulativeARPDAU[arm] : day.arpdau[arm] }
        var top = 0.0
        for day in days { for arm in ExperimentArm.allCases { if let e = estimate(day, arm) { top = max(top, e.high ?? e.value ?? 0) } } }
        top = top > 0 ? top * 1.1 : 1
        let plotWidth = Self.width - Self.left - Self.right, plotHeight = Self.height - Self.top - Self.bottom
        let band = plotWidth / Double(max(days.count, 1))
        func y(_ value: Double) -> Double { Self.top + plotHeight - plotHeight * max(0, min(value, top)) / top }
        var out = "<svg class=\"chart\" data-chart=\"\(HTML.escape(id))\" viewBox=\"0 0 \(Int(Self.width)) \(Int(Self.height))\" role=\"img\" aria-label=\"ARPDAU \(cumulative ? "cumulative" : "by day") per arm\" xmlns=\"http://www.w3.org/2000/svg\">"
        for step in 0...4 {
            let value = top * Double(step) / 4
            out += "<line class=\"grid\" x1=\"\(f(Self.left))\" x2=\"\(f(Self.left + plotWidth))\" y1=\"\(f(y(value)))\" y2=\"\(f(y(value)))\"/>"
            out += "<text class=\"tick\" x=\"\(f(Self.left - 6))\" y=\"\(f(y(value) + 4))\" text-anchor=\"end\">\(String(format: top < 0.1 ? "%.4f" : "%.3f", value))</text>"
        }
        let labelEvery = max(1, days.count / 8)
        for (index, day) in days.enumerated() where index % labelEvery == 0 {
            out += "<text class=\"tick\" x=\"\(f(Self.left + band * (Double(index) + 0.5)))\" y=\"\(f(Self.top + plotHeight + 16))\" text-anchor=\"middle\">\(HTML.escape(String(day.date.dropFirst(5))))</text>"
        }
        for (arm, colour, shift) in [(ExperimentArm.control, 0, -0.12), (.treatment, 6, 0.12)] {
            var path = "", bandTop: [String] = [], bandBottom: [String] = [], marks = ""
            for (index, day) in days.enumerated() {
                guard let e = estimate(day, arm), let value = e.value else { continue }
                let x = Self.left + band * (Double(index) + 0.5 + (cumulative ? 0 : shift))
                let tip = "\(arm.rawValue) · \(day.date) · ARPDAU \(String(format: "%.4f", value)) \(r.currency)"
                    + (e.low.map { " (95 % interval \(String(format: "%.4f", $0)) to \(String(format: "%.4f", e.high!)))" } ?? "")
                    + " · \(Int(day.active[arm] ?? 0)) active of \(Int(day.devices[arm] ?? 0)) exposed"
                if let low = e.low, let high = e.high {
                    if cumulative {
                        bandTop.append("\(f(x)),\(f(y(high)))")
                        bandBottom.insert("\(f(x)),\(f(y(low)))", at: 0)
                    } else {
                        out += "<line class=\"interval c\(colour)\" x1=\"\(f(x))\" x2=\"\(f(x))\" y1=\"\(f(y(low)))\" y2=\"\(f(y(high)))\"/>"
                    }
                }
                path += "\(path.isEmpty ? "M" : "L")\(f(x)) \(f(y(value)))"
                marks += "<circle class=\"mark c\(colour)\" data-series=\"\(arm.rawValue)\" data-cat=\"\(day.date)\" data-value=\"\(value)\" data-low=\"\(e.low.map { "\($0)" } ?? "")\" data-high=\"\(e.high.map { "\($0)" } ?? "")\" cx=\"\(f(x))\" cy=\"\(f(y(value)))\" r=\"3\"><title>\(HTML.escape(tip))</title></circle>"
            }
            if cumulative, !bandTop.isEmpty { out += "<polygon class=\"band c\(colour)\" points=\"\((bandTop + bandBottom).joined(separator: " "))\"/>" }
            if cumulative, !path.isEmpty { out += "<path class=\"line c\(colour)\" d=\"\(path)\"/>" }
            out += marks
        }
        return out + "</svg>"
    }

    /// The ARPDAU lift (and the other metrics' beside it) as points with their intervals against 0.
    func liftSVG(_ r: ExperimentResults) -> String {
        let metrics = ExperimentStatistics.metrics.filter { r.lifts[$0]?.value != nil }
        guard !metrics.isEmpty else { return "<p class=\"muted\">No lift yet: an arm has no active device-day.</p>" }
        var extent = 0.05
        for metric in metrics { if let lift = r.lifts[metric] { extent = max(extent, abs(lift.low ?? 0), abs(lift.high ?? 0)) } }
        extent = min(extent * 1.15, 5)
        let rowHeight = 22.0, labelWidth = 170.0, width = Self.width, plot = width - labelWidth - 90
        let height = 26 + rowHeight * Double(metrics.count)
        func x(_ value: Double) -> Double { labelWidth + plot * (max(-extent, min(value, extent)) + extent) / (2 * extent) }
        var out = "<figure class=\"lift\"><figcaption>Lift of the treatment over the control, with 95 % intervals</figcaption>"
        out += "<svg class=\"chart\" data-chart=\"experiment-lift:\(HTML.escape(r.experiment.name))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\" aria-label=\"Lift with intervals\" xmlns=\"http://www.w3.org/2000/svg\">"
        out += "<line class=\"axis\" x1=\"\(f(x(0)))\" x2=\"\(f(x(0)))\" y1=\"4\" y2=\"\(f(height - 18))\"/>"
        out += "<text class=\"tick\" x=\"\(f(x(0)))\" y=\"\(f(height - 4))\" text-anchor=\"middle\">0</text>"
        out += "<text class=\"tick\" x=\"\(f(x(-extent)))\" y=\"\(f(height - 4))\">\(String(format: "%+.0f%%", -extent * 100))</text>"
        out += "<text class=\"tick\" x=\"\(f(x(extent)))\" y=\"\(f(height - 4))\" text-anchor=\"end\">\(String(format: "%+.0f%%", extent * 100))</text>"
        for (index, metric) in metrics.enumerated() {
            let lift = r.lifts[metric]!
            let y = 14 + rowHeight * Double(index)
            let colour = !lift.isSignificant ? 10 : (lift.difference.value ?? 0) > 0 ? 1 : 3
            out += "<text class=\"tick\" x=\"4\" y=\"\(f(y + 4))\">\(metric)</text>"
            if let low = lift.low, let high = lift.high {
                out += "<line class=\"interval c\(colour)\" x1=\"\(f(x(low)))\" x2=\"\(f(x(high)))\" y1=\"\(f(y))\" y2=\"\(f(y))\"/>"
            }
            let text = String(format: "%+.1f%%", (lift.value ?? 0) * 100) + (lift.low.map { String(format: " [%+.1f%%, %+.1f%%]", $0 * 100, lift.high! * 100) } ?? "")
            out += "<circle class=\"mark c\(colour)\" data-series=\"lift\" data-cat=\"\(metric)\" data-value=\"\(lift.value ?? 0)\" data-low=\"\(lift.low.map { "\($0)" } ?? "")\" data-high=\"\(lift.high.map { "\($0)" } ?? "")\" data-significant=\"\(lift.isSignificant)\" cx=\"\(f(x(lift.value ?? 0)))\" cy=\"\(f(y))\" r=\"4\"><title>\(HTML.escape("\(metric) lift \(text)\(lift.isSignificant ? ", significant" : ", not significant")"))</title></circle>"
            out += "<text class=\"tick\" x=\"\(f(width - 4))\" y=\"\(f(y + 4))\" text-anchor=\"end\">\(HTML.escape(text))</text>"
        }
        return out + "</svg></figure>"
    }
}

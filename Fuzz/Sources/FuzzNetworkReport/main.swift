import AdTallyCore
import FuzzDriver

/// The readers of the networks' own reports (`POST /v1/network-reports`, `adtally
/// networks import`): every input read as each of the four sources, as an admin's
/// upload may be anything. A report that is read must hold only lines inside the rules
/// (counts to 10^12, amounts ≥ 0, a format, a currency) and within its own days; any
/// trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzNetworkReport(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    for source in NetworkReportSource.allCases {
        guard let report = try? NetworkReport.parse(bytes, source: source) else { continue }
        for line in report.lines {
            guard (0...1_000_000_000_000).contains(line.impressions), (line.clicks ?? 0) >= 0, line.revenueMicros >= 0,
                  line.currency.utf8.count == 3, !line.app.isEmpty, !line.network.isEmpty else {
                fatalError("a \(source) line outside the rules: \(line)")
            }
        }
        if let first = report.firstDay, let last = report.lastDay, report.lines.contains(where: { $0.day < first || $0.day > last }) {
            fatalError("a \(source) line outside the report's own days")
        }
    }
    return 0
}

runFuzzer { data, count in
    guard let data else { return 0 }
    return fuzzNetworkReport(data, count)
}

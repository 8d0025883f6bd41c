import Foundation
import AdTallyCore
import FuzzDriver

/// One input as a CSV file fed in two chunks (split where its first byte says):
/// records become raw events by the header, as `adtally ingest` does, and are
/// validated in text-values mode. The same bytes are also read as a rate card and
/// as an FX file (the bodies `POST /v1/rates` and `POST /v1/fx` take as text/csv).
/// Any trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCSV(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    let split = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
    var reader = CSVRecordReader()
    var records = reader.feed(bytes[..<split])
    records += reader.feed(bytes[split...])
    if let last = reader.finish() { records.append(last) }
    _ = try? RateCardEntry.parseCSV(bytes)
    _ = try? FXRate.parseCSV(bytes, base: "EUR")
    guard let header = records.first?.fields else { return 0 }
    let validator = EventValidator(appID: "fuzz", acceptsTextValues: true)
    for record in records.dropFirst() {
        var raw = RawEvent()
        for (column, value) in zip(header, record.fields) { raw.set(column.lowercased(), .string(value)) }
        _ = try? validator.validate(raw, nowMicros: 1_763_720_000_000_000)
    }
    return 0
}

runFuzzer { data, count in
    guard let data else { return 0 }
    return fuzzCSV(data, count)
}

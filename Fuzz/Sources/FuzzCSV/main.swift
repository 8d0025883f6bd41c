import Foundation
import AdTallyCore
import FuzzDriver

/// One input as a CSV file fed in two chunks (split where its first byte says):
/// records become raw events by the header, as `adtally ingest` does, and are
/// validated in text-values mode. Any trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCSV(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    let split = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
    var reader = CSVRecordReader()
    var records = reader.feed(bytes[..<split])
    records += reader.feed(bytes[split...])
    if let last = reader.finish() { records.append(last) }
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

import AdTallyCore
import FuzzDriver

/// The FX and rate-card CSV readers (`POST /v1/fx`, `POST /v1/rates`, `adtally fx|rates
/// import`), as the server runs them: the FX reader fed in two chunks split where the
/// first byte says (a BOM or a record may straddle them) must give what it gives fed
/// whole. Also the CSV cell writer: any text written as a cell reads back as itself,
/// with a `'` first exactly when it would start a formula. Any trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMoneyCSV(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    _ = try? RateCardEntry.parseCSV(bytes)
    let whole = try? FXRate.parseCSV(bytes, base: "eur")
    let split = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
    var chunked: [FXRate]?
    if var reader = try? FXCSVReader(base: "EUR") {
        do {
            var rates = try reader.feed(bytes[..<split]).map(\.rate)
            rates += try reader.feed(bytes[split...]).map(\.rate)
            rates += try reader.finish().map(\.rate)
            chunked = rates
        } catch {
            chunked = nil
        }
    }
    if whole != chunked { fatalError("the FX reader gave another answer fed in two chunks") }

    let text = String(decoding: bytes, as: UTF8.self)
    var cell: [UInt8] = []
    ReportText.appendCSVText(text, to: &cell)
    // After a first cell, as in every report row: a file's first bytes may be a BOM.
    let records = CSVRecordReader.records(of: Array("x,".utf8) + cell + [0x0D, 0x0A])
    let expected = ReportText.startsLikeFormula(text) ? "'" + text : text
    guard records.count == 1, records[0].fields == ["x", expected] else { fatalError("a written cell read back as \(records), not [x, \(expected)]") }
    return 0
}

runFuzzer { data, count in
    guard let data else { return 0 }
    return fuzzMoneyCSV(data, count)
}

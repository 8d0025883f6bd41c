import Foundation
import AdTallyCore
import FuzzDriver

/// One input: read as a JSON body and as NDJSON (at most 1,000 events, as the
/// server does), and validate every event read. Any trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzIngestBody(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: count)
    let validator = EventValidator(appID: "fuzz")
    let now: Int64 = 1_763_720_000_000_000
    var slots: [EventBatchReader.Slot] = []
    if let json = try? EventBatchReader.readJSON(bytes, maxEvents: 1000) { slots += json }
    if let lines = try? EventBatchReader.readNDJSON(bytes, maxEvents: 1000) { slots += lines }
    for case .event(let raw) in slots {
        _ = try? validator.validate(raw, nowMicros: now)
    }
    return 0
}

runFuzzer { data, count in
    guard let data else { return 0 }
    return fuzzIngestBody(data, count)
}

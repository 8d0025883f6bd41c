import Foundation
import AdTallyCore

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

/// libFuzzer's driver, called from this target's own main (SwiftPM gives every
/// executable target one, so libFuzzer's main is not linked in).
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<Int32>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32
) -> Int32

var argc = CommandLine.argc
var argv = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, count in
    guard let data else { return 0 }
    return fuzzIngestBody(data, count)
})

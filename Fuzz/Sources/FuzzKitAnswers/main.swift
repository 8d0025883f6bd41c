@_spi(Answers) import AdTallyKit
import Foundation
import FuzzDriver

/// AdTallyKit's readers of what the network answers (DESIGN §10): the batch receipt and
/// the switch answer, every input read as each. The first two bytes choose the batch's
/// size (1 to 1,000) and whether the content type is JSON. A receipt that is believed
/// must name each event at most once, inside the batch, with counts that add up to it;
/// a switch answer believed must name a network by the server's rule; any trap is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzKitAnswers(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    guard count >= 2 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: count))
    let batch = Int(bytes[0]) * 4 % 1000 + 1
    let mediaType = bytes[1] & 1 == 0 ? "application/json" : "text/html"
    let body = Data(bytes[2...])
    if case .success(let receipt) = Receipt.parse(body, mediaType: mediaType, count: batch) {
        let indexes = receipt.rejected.map(\.index)
        guard receipt.accepted + receipt.duplicates + indexes.count == batch, Set(indexes).count == indexes.count,
              indexes.allSatisfy({ (0..<batch).contains($0) }), receipt.rejected.allSatisfy({ $0.reason.utf8.count <= 1024 }) else {
            fatalError("a receipt believed that does not answer the batch of \(batch): \(receipt)")
        }
    }
    if case .success(let network) = SwitchAnswer.parse(body, mediaType: mediaType) {
        guard SwitchAnswer.isNetworkName(network), (1...32).contains(network.utf8.count),
              network.utf8.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5F || $0 == 0x2E || $0 == 0x2D }) else {
            fatalError("a switch answer believed with a network the server could not have sent: \(network.debugDescription)")
        }
    }
    return 0
}

runFuzzer { data, count in
    guard let data else { return 0 }
    return fuzzKitAnswers(data, count)
}

import Foundation
import Testing
import TextFormats

@Suite("UUID text")
struct UUIDTextTests {
    @Test("parses what Foundation parses, in either case, and prints it back lowercase")
    func roundTrip() {
        for _ in 0..<2_000 {
            let id = UUID()
            #expect(UUIDText.parse(id.uuidString) == id)
            #expect(UUIDText.parse(id.uuidString.lowercased()) == id)
            #expect(UUIDText.string(id) == id.uuidString.lowercased())
        }
        #expect(UUIDText.parse("00000000-0000-0000-0000-000000000000") == UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
        #expect(UUIDText.parse("FFFFFFFF-ffff-FFFF-ffff-FFFFFFFFFFFF") == UUID(uuidString: "ffffffff-ffff-ffff-ffff-ffffffffffff"))
    }

    @Test("refuses anything but the 8-4-4-4-12 hex form", arguments: [
        "", "nope", "9b1e842f6e864629a554f503555d8025", "9b1e842f-6e86-4629-a554-f503555d802",
        "9b1e842f-6e86-4629-a554-f503555d80255", "9b1e842f-6e864-629-a554-f503555d8025",
        "9b1e842g-6e86-4629-a554-f503555d8025", "{9b1e842f-6e86-4629-a554-f503555d80}",
        "9b1e842f-6e86-4629-a554-f503555d80é", "9b1e842f 6e86-4629-a554-f503555d8025",
    ])
    func refusals(text: String) {
        #expect(UUIDText.parse(text) == nil)
    }
}

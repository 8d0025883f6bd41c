import Foundation

/// UUID text without Foundation's parser (which goes through sscanf): ingest
/// parses and prints one for every event.
public enum UUIDText {
    /// Parses the canonical 8-4-4-4-12 form, either case.
    public static func parse(_ text: String) -> UUID? {
        var text = text
        return text.withUTF8 { bytes -> UUID? in
            guard bytes.count == 36, bytes[8] == 0x2D, bytes[13] == 0x2D, bytes[18] == 0x2D, bytes[23] == 0x2D else { return nil }
            var raw = [UInt8](repeating: 0, count: 16)
            var out = 0
            var index = 0
            while index < 36 {
                if index == 8 || index == 13 || index == 18 || index == 23 { index += 1; continue }
                guard let high = hex(bytes[index]), let low = hex(bytes[index + 1]) else { return nil }
                raw[out] = high << 4 | low
                out += 1
                index += 2
            }
            return UUID(uuid: (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
                               raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]))
        }
    }

    /// Appends the lowercase canonical form.
    public static func append(_ id: UUID, to out: inout [UInt8]) {
        let digits: StaticString = "0123456789abcdef"
        withUnsafeBytes(of: id.uuid) { bytes in
            for (index, byte) in bytes.enumerated() {
                if index == 4 || index == 6 || index == 8 || index == 10 { out.append(0x2D) }
                out.append(digits.utf8Start[Int(byte >> 4)])
                out.append(digits.utf8Start[Int(byte & 0xF)])
            }
        }
    }

    /// The lowercase canonical form.
    public static func string(_ id: UUID) -> String {
        var out = [UInt8]()
        out.reserveCapacity(36)
        append(id, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @inline(__always)
    static func hex(_ char: UInt8) -> UInt8? {
        switch char {
        case 0x30...0x39: char - 0x30
        case 0x61...0x66: char - 0x61 + 10
        case 0x41...0x46: char - 0x41 + 10
        default: nil
        }
    }
}

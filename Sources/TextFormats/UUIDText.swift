import Foundation

/// UUID text without Foundation's parser (which goes through sscanf): ingest
/// parses and prints one for every event.
public enum UUIDText {
    /// Parses the canonical 8-4-4-4-12 form, either case.
    public static func parse(_ text: String) -> UUID? {
        var text = text
        return text.withUTF8 { bytes -> UUID? in
            guard bytes.count == 36, bytes[8] == 0x2D, bytes[13] == 0x2D, bytes[18] == 0x2D, bytes[23] == 0x2D else { return nil }
            // The 32 hex digits as two 64-bit halves: no array per UUID.
            var halves: (UInt64, UInt64) = (0, 0)
            var digits = 0
            for index in 0..<36 where index != 8 && index != 13 && index != 18 && index != 23 {
                let value = hexValues[Int(bytes[index])]
                guard value != 0xFF else { return nil }
                if digits < 16 { halves.0 = halves.0 << 4 | UInt64(value) } else { halves.1 = halves.1 << 4 | UInt64(value) }
                digits += 1
            }
            var uuid: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            withUnsafeMutableBytes(of: &uuid) { raw in
                raw.storeBytes(of: halves.0.bigEndian, toByteOffset: 0, as: UInt64.self)
                raw.storeBytes(of: halves.1.bigEndian, toByteOffset: 8, as: UInt64.self)
            }
            return UUID(uuid: uuid)
        }
    }

    /// Hex digit values by byte; 0xFF for bytes that are not hex digits.
    static let hexValues: [UInt8] = (0...255).map { byte in hex(UInt8(byte)) ?? 0xFF }

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

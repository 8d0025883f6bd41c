/// The 64-bit hash of a `device` value that unique-device sketches count: the
/// first half of MurmurHash3 x64-128 with seed 0 over its UTF-8 bytes, which is
/// what the hll extension's `hll_hash_text(device)` computes. The ingest path
/// hashes here and PostgreSQL sketches raw events with hll_hash_text; both must
/// agree (a test checks them against each other).
public enum DeviceHash {
    /// The hash of `device`, as hll_hash_text(device) returns it.
    public static func hash(_ device: String) -> Int64 {
        var device = device
        return device.withUTF8 { hash(UnsafeRawBufferPointer($0)) }
    }

    /// The hash of some bytes.
    public static func hash(_ bytes: UnsafeRawBufferPointer) -> Int64 {
        let c1: UInt64 = 0x87c3_7b91_1142_53d5
        let c2: UInt64 = 0x4cf5_ad43_2745_937f
        var h1: UInt64 = 0
        var h2: UInt64 = 0
        let length = bytes.count
        let blocks = length / 16
        for block in 0..<blocks {
            var k1 = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: block * 16, as: UInt64.self))
            var k2 = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: block * 16 + 8, as: UInt64.self))
            k1 &*= c1; k1 = rotate(k1, 31); k1 &*= c2; h1 ^= k1
            h1 = rotate(h1, 27); h1 &+= h2; h1 = h1 &* 5 &+ 0x52dc_e729
            k2 &*= c2; k2 = rotate(k2, 33); k2 &*= c1; h2 ^= k2
            h2 = rotate(h2, 31); h2 &+= h1; h2 = h2 &* 5 &+ 0x3849_5ab5
        }
        let tail = blocks * 16
        let rest = length & 15
        var k1: UInt64 = 0
        var k2: UInt64 = 0
        if rest > 8 {
            for index in stride(from: rest - 1, through: 8, by: -1) { k2 ^= UInt64(bytes[tail + index]) << (8 * UInt64(index - 8)) }
            k2 &*= c2; k2 = rotate(k2, 33); k2 &*= c1; h2 ^= k2
        }
        if rest > 0 {
            for index in stride(from: min(rest, 8) - 1, through: 0, by: -1) { k1 ^= UInt64(bytes[tail + index]) << (8 * UInt64(index)) }
            k1 &*= c1; k1 = rotate(k1, 31); k1 &*= c2; h1 ^= k1
        }
        h1 ^= UInt64(length); h2 ^= UInt64(length)
        h1 &+= h2; h2 &+= h1
        h1 = mix(h1); h2 = mix(h2)
        h1 &+= h2
        return Int64(bitPattern: h1)
    }

    @inline(__always) static func rotate(_ value: UInt64, _ bits: UInt64) -> UInt64 {
        value << bits | value >> (64 - bits)
    }

    @inline(__always) static func mix(_ value: UInt64) -> UInt64 {
        var k = value
        k ^= k >> 33; k &*= 0xff51_afd7_ed55_8ccd
        k ^= k >> 33; k &*= 0xc4ce_b9fe_1a85_ec53
        k ^= k >> 33
        return k
    }
}

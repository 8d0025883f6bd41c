import CZlib

/// Inflates a gzip body without ever holding more than `limit` decompressed bytes,
/// so a gzip bomb is refused, not inflated.
enum Gunzip {
    enum Failure: Error, Equatable {
        case tooLarge
        case corrupt(String)
    }

    static func inflate(_ input: [UInt8], limit: Int) throws(Failure) -> [UInt8] {
        var stream = z_stream()
        // 15 + 32: zlib or gzip header, detected automatically.
        guard inflateInit2_(&stream, 15 + 32, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw .corrupt("zlib could not start")
        }
        defer { inflateEnd(&stream) }
        var output = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        var status: Int32 = Z_OK
        var failure: Failure?
        input.withUnsafeBufferPointer { inputBuffer in
            stream.next_in = UnsafeMutablePointer(mutating: inputBuffer.baseAddress)
            stream.avail_in = UInt32(inputBuffer.count)
            repeat {
                status = chunk.withUnsafeMutableBufferPointer { chunkBuffer in
                    stream.next_out = chunkBuffer.baseAddress
                    stream.avail_out = UInt32(chunkBuffer.count)
                    return CZlib.inflate(&stream, Z_NO_FLUSH)
                }
                let produced = chunk.count - Int(stream.avail_out)
                if output.count + produced > limit {
                    failure = .tooLarge
                    return
                }
                output.append(contentsOf: chunk[0..<produced])
                if status == Z_STREAM_END { return }
                if status == Z_BUF_ERROR || (stream.avail_in == 0 && produced == 0) {
                    failure = .corrupt("truncated gzip stream")
                    return
                }
                if status != Z_OK {
                    failure = .corrupt(stream.msg.map { String(cString: $0) } ?? "status \(status)")
                    return
                }
            } while true
        }
        if let failure { throw failure }
        return output
    }
}

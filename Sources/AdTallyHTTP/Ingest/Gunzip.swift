import CZlib

/// Inflates a gzip body without ever holding more than `limit` decompressed bytes,
/// so a gzip bomb is refused, not inflated.
///
/// A gzip file may hold several members one after another (`cat a.gz b.gz`, and
/// clients that compress a stream in pieces): each is inflated in turn, all within
/// the one limit, and bytes after the last member that are not gzip are an error,
/// never silently dropped.
enum Gunzip {
    enum Failure: Error, Equatable {
        case tooLarge
        case corrupt(String)
    }

    static func inflate(_ input: UnsafeRawBufferPointer, limit: Int) throws(Failure) -> [UInt8] {
        var stream = z_stream()
        // 15 + 32: zlib or gzip header, detected automatically.
        guard inflateInit2_(&stream, 15 + 32, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw .corrupt("zlib could not start")
        }
        defer { inflateEnd(&stream) }
        var output = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        stream.next_in = UnsafeMutablePointer(mutating: input.baseAddress?.assumingMemoryBound(to: UInt8.self))
        stream.avail_in = UInt32(input.count)
        while true {
            let status = chunk.withUnsafeMutableBufferPointer { chunkBuffer in
                stream.next_out = chunkBuffer.baseAddress
                stream.avail_out = UInt32(chunkBuffer.count)
                return CZlib.inflate(&stream, Z_NO_FLUSH)
            }
            let produced = chunk.count - Int(stream.avail_out)
            if output.count + produced > limit { throw .tooLarge }
            output.append(contentsOf: chunk[0..<produced])
            if status == Z_STREAM_END {
                if stream.avail_in == 0 { return output }
                // Another member follows: start over on the rest of the input.
                guard inflateReset(&stream) == Z_OK else { throw .corrupt("zlib could not restart for the next gzip member") }
                continue
            }
            if status == Z_BUF_ERROR || (stream.avail_in == 0 && produced == 0) { throw .corrupt("truncated gzip stream") }
            if status != Z_OK { throw .corrupt(stream.msg.map { String(cString: $0) } ?? "status \(status)") }
        }
    }
}

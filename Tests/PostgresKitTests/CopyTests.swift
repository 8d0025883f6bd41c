import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("COPY FROM STDIN")
struct CopyTests {
    @Test("multi-byte rows are stored intact, byte for byte")
    func multiByteRowsRoundTrip() async throws {
        let samples = ["日本語テキスト", "emoji 😀🚀", "tab\there", "new\nline", "back\\slash", "cr\rlf", "\\N literally", "ñandú", ""]
        var buffer = PostgresCopyBuffer()
        var expected: [(Int, String?)] = []
        for index in 0..<20_000 {
            let text: String? = index % 97 == 0 ? nil : samples[index % samples.count] + " #\(index)"
            buffer.append(index)
            try buffer.append(text)
            buffer.endRow()
            expected.append((index, text))
        }
        #expect(buffer.bytes.count > buffer.rowCount)  // multi-byte: more bytes than characters
        try await TestDatabase.withPool { pool in
            try await pool.query("CREATE TABLE t (n int PRIMARY KEY, label text)")
            let sent = buffer
            let copied = try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY t (n, label) FROM STDIN", data: sent) }
            #expect(copied == 20_000)
            let rows = try await pool.query("SELECT n, label FROM t ORDER BY n")
            #expect(rows.count == expected.count)
            for (row, (index, text)) in zip(rows, expected) {
                #expect(try row.decode("n", as: Int.self) == index)
                #expect(try row.decode("label", as: String?.self) == text)
            }
        }
    }

    @Test("integers are written as PostgreSQL reads them, at both ends of Int64")
    func integerText() {
        let numbers: [Int64?] = [0, 7, 9, 10, 99, 100, -1, -10, 1_234_567_890, .max, .min, nil]
        var buffer = PostgresCopyBuffer()
        for number in numbers { buffer.append(number) }
        buffer.endRow()
        let expected = numbers.map { $0.map(String.init) ?? "\\N" }.joined(separator: "\t") + "\n"
        #expect(String(decoding: buffer.bytes, as: UTF8.self) == expected)
    }

    @Test("a failing COPY reports its SQLSTATE and leaves the connection usable")
    func failingCopyReportsSQLState() async throws {
        var buffer = PostgresCopyBuffer()
        try buffer.append("not-a-uuid")
        buffer.endRow()
        let data = buffer
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            try await pool.query("CREATE TABLE t (id uuid)")
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY t (id) FROM STDIN", data: data) }
            }
            #expect(error?.sqlState == .invalidTextRepresentation)
            let rows = try await pool.query("SELECT count(*)::int AS n FROM t")
            #expect(try rows[0].decode("n", as: Int.self) == 0)
        }
    }

    @Test("COPY into a missing table fails with undefined_table")
    func copyIntoMissingTable() async throws {
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY nope (id) FROM STDIN", data: PostgresCopyBuffer()) }
            }
            #expect(error?.sqlState == .undefinedTable)
            let rows = try await pool.query("SELECT 1 AS one")
            #expect(rows.count == 1)
        }
    }

    @Test("a NUL byte in a COPY field is refused before anything is sent")
    func nulInCopyField() throws {
        var buffer = PostgresCopyBuffer()
        #expect(throws: PostgresError.self) { try buffer.append("a\u{0}b") }
    }
}

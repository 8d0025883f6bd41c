import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("COPY FROM STDIN")
struct CopyTests {
    @Test("multi-byte rows are stored intact, byte for byte")
    func multiByteRowsRoundTrip() async throws {
        let samples = ["日本語テキスト", "emoji 😀🚀", "tab\there", "new\nline", "back\\slash", "cr\rlf", "\\N literally", "ñandú", ""]
        var buffer = PostgresCopyBuffer(columns: 2)
        var expected: [(Int, String?)] = []
        for index in 0..<20_000 {
            let text: String? = index % 97 == 0 ? nil : samples[index % samples.count] + " #\(index)"
            try buffer.appendInt32(Int64(index))
            try buffer.append(text)
            buffer.endRow()
            expected.append((index, text))
        }
        #expect(buffer.rowCount == 20_000)
        try await TestDatabase.withPool { pool in
            try await pool.query("CREATE TABLE t (n int PRIMARY KEY, label text)")
            let sent = buffer
            let copied = try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY t (n, label) FROM STDIN (FORMAT binary)", data: sent) }
            #expect(copied == 20_000)
            let rows = try await pool.query("SELECT n, label FROM t ORDER BY n")
            #expect(rows.count == expected.count)
            for (row, (index, text)) in zip(rows, expected) {
                #expect(try row.decode("n", as: Int.self) == index)
                #expect(try row.decode("label", as: String?.self) == text)
            }
        }
    }

    @Test("every field type arrives as PostgreSQL's own value, at the ends of its range")
    func everyTypeRoundTrips() async throws {
        let id = UUID()
        // Microseconds since 1970: before and after PostgreSQL's 2000 epoch, with fractions.
        let times: [Int64] = [0, -1, 946_684_800_000_000, 946_684_799_999_999, 1_763_720_000_123_456]
        let bigints: [Int64?] = [.max, .min, 0, -1, nil]
        let ints: [Int64?] = [Int64(Int32.max), Int64(Int32.min), 0, 7, nil]
        let flags: [Bool?] = [true, false, nil, true, false]
        let texts: [String?] = ["JP", "ZZ", nil, "é", ""]
        var buffer = PostgresCopyBuffer(columns: 7)
        for row in 0..<5 {
            buffer.append(id)
            buffer.append(PostgresMicros(times[row]))
            buffer.append(bigints[row])
            try buffer.appendInt32(ints[row])
            buffer.append(flags[row])
            try buffer.append(texts[row].map { String($0.prefix(2)) })
            try buffer.append(texts[row])
            buffer.endRow()
        }
        let sent = buffer
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            try await pool.query("CREATE TABLE t (n serial, id uuid, at timestamptz, big bigint, small integer, flag boolean, code char(2), label text)")
            _ = try await pool.withConnection {
                try $0.copyIn(unsafeSQL: "COPY t (id, at, big, small, flag, code, label) FROM STDIN (FORMAT binary)", data: sent)
            }
            let rows = try await pool.query("""
                SELECT id, (extract(epoch FROM at) * 1000000)::bigint AS micros, big, small, flag, code, label FROM t ORDER BY n
                """)
            #expect(rows.count == 5)
            for (row, index) in zip(rows, 0..<5) {
                #expect(try row.decode("id", as: UUID.self) == id)
                #expect(try row.decode("micros", as: Int64.self) == times[index])
                #expect(try row.decode("big", as: Int64?.self) == bigints[index])
                #expect(try row.decode("small", as: Int64?.self) == ints[index])
                #expect(try row.decode("flag", as: Bool?.self) == flags[index])
                #expect(try row.decode("label", as: String?.self) == texts[index])
            }
        }
    }

    @Test("a value too wide for an integer column is refused before anything is sent")
    func integerOverflow() {
        var buffer = PostgresCopyBuffer(columns: 1)
        #expect(throws: PostgresError.self) { try buffer.appendInt32(Int64(Int32.max) + 1) }
    }

    @Test("a field of the wrong type fails the COPY with its SQLSTATE and leaves the connection usable")
    func failingCopyReportsSQLState() async throws {
        var buffer = PostgresCopyBuffer(columns: 1)
        buffer.append(Int64(7))  // 8 bytes for a 4-byte column
        buffer.endRow()
        let data = buffer
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            try await pool.query("CREATE TABLE t (n integer)")
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY t (n) FROM STDIN (FORMAT binary)", data: data) }
            }
            #expect(error?.sqlState == .invalidBinaryRepresentation)
            let rows = try await pool.query("SELECT count(*)::int AS n FROM t")
            #expect(try rows[0].decode("n", as: Int.self) == 0)
        }
    }

    @Test("a COPY statement without (FORMAT binary) is refused by name and the connection stays usable")
    func textFormatStatementRefused() async throws {
        var buffer = PostgresCopyBuffer(columns: 1)
        try buffer.append("x")
        buffer.endRow()
        let data = buffer
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            try await pool.query("CREATE TABLE t (label text)")
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY t (label) FROM STDIN", data: data) }
            }
            #expect(error?.message.contains("FORMAT binary") == true)
            let rows = try await pool.query("SELECT count(*)::int AS n FROM t")
            #expect(try rows[0].decode("n", as: Int.self) == 0)
        }
    }

    @Test("COPY into a missing table fails with undefined_table")
    func copyIntoMissingTable() async throws {
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try $0.copyIn(unsafeSQL: "COPY nope (id) FROM STDIN (FORMAT binary)", data: PostgresCopyBuffer(columns: 1)) }
            }
            #expect(error?.sqlState == .undefinedTable)
            let rows = try await pool.query("SELECT 1 AS one")
            #expect(rows.count == 1)
        }
    }

    @Test("a NUL byte in a COPY field is refused before anything is sent")
    func nulInCopyField() throws {
        var buffer = PostgresCopyBuffer(columns: 1)
        #expect(throws: PostgresError.self) { try buffer.append("a\u{0}b") }
    }
}

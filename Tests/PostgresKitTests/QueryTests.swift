import AdTallyTestSupport
import Foundation
@testable import PostgresKit
import Testing

@Suite("Bound queries and typed rows")
struct QueryTests {
    @Test("hostile strings round-trip unchanged as bound parameters")
    func hostileStringsRoundTrip() async throws {
        let megabyte = String(repeating: "ab'\\\"c😀\t\n", count: 100_000)
        let samples = [
            "'; DROP TABLE apps; --", "back\\slash\\\\", "quote'\"mixed", "emoji 🚀👩‍👩‍👧‍👦 ñ 日本語",
            "$1 $2 placeholders", "", " ", "\\x00 not a nul", megabyte,
        ]
        try await TestDatabase.withPool { pool in
            for sample in samples {
                let rows = try await pool.query("SELECT \(sample)::text AS value, octet_length(\(sample)::text) AS bytes")
                #expect(try rows[0].decode("value", as: String.self) == sample)
                #expect(try rows[0].decode("bytes", as: Int.self) == sample.utf8.count)
            }
        }
    }

    @Test("prepared statements: parsed once per connection, the least recently used dropped past the limit, errors redacted")
    func preparedStatements() async throws {
        try await TestDatabase.withPool { pool in
            try await pool.withConnection { connection in
                let limit = PostgresConnection.preparedStatementLimit
                for round in 0..<2 {
                    for n in 0..<(limit + 8) {
                        // A text per n; the round is a parameter of the same text.
                        let rows = try connection.queryPrepared("SELECT \(unsafeRaw: String(n)) + \(round)::int AS v")
                        #expect(try rows[0].decode("v", as: Int.self) == n + round)
                    }
                }
                let prepared = try connection.query("SELECT count(*) FROM pg_prepared_statements").first!.decode(0, as: Int.self)
                #expect(prepared == limit)
                let error = #expect(throws: PostgresError.self) {
                    try connection.queryPrepared("SELECT 1 / \(0)::int, \("secret")::text")
                }
                #expect(error?.description.contains("secret") == false)
            }
        }
    }

    @Test("a NUL byte in a bound string is refused with a clear error")
    func nulByteIsRefused() async throws {
        try await TestDatabase.withPool { pool in
            let error = await #expect(throws: PostgresError.self) {
                try await pool.query("SELECT \("a\u{0}b")::text")
            }
            #expect(error?.kind == .invalidParameter)
            #expect(error?.description.contains("NUL byte") == true)
            #expect(error?.description.contains("$1") == true)
            // The connection is still fine afterwards.
            let rows = try await pool.query("SELECT 1 AS one")
            #expect(try rows[0].decode("one", as: Int.self) == 1)
        }
    }

    @Test("NULL decodes to nil for optionals and is an error naming the column otherwise")
    func nullsDecode() async throws {
        try await TestDatabase.withPool { pool in
            let missing: String? = nil
            let rows = try await pool.query("SELECT \(missing)::text AS nothing, 5::int AS five")
            #expect(try rows[0].decode("nothing", as: String?.self) == nil)
            #expect(try rows[0].decode("five", as: Int?.self) == 5)
            let error = #expect(throws: PostgresError.self) { try rows[0].decode("nothing", as: String.self) }
            #expect(error?.kind == .decoding)
            #expect(error?.description.contains("\"nothing\"") == true)
            #expect(error?.description.contains("text") == true)
        }
    }

    @Test("every supported type round-trips; a failed decode names column and type")
    func typedDecoding() async throws {
        try await TestDatabase.withPool { pool in
            let id = UUID()
            let when = Date(timeIntervalSince1970: 1_763_720_000.123456)
            let bytes = PostgresBytes([0, 1, 2, 0xFF, 0x7F, 92])
            let rows = try await pool.query("""
                SELECT \(Int64.max) AS big, \(Int32(-7)) AS small, \(Int16(12)) AS tiny, \(2.5e-7) AS ratio,
                       \(true) AS yes, \(id) AS id, \(when) AS at, \(bytes) AS raw,
                       '2026-03-29 01:30:00+05:45'::timestamptz AS kathmandu
                """)
            let row = rows[0]
            #expect(try row.decode("big", as: Int64.self) == Int64.max)
            #expect(try row.decode("small", as: Int32.self) == -7)
            #expect(try row.decode("tiny", as: Int16.self) == 12)
            #expect(try row.decode("ratio", as: Double.self) == 2.5e-7)
            #expect(try row.decode("yes", as: Bool.self) == true)
            #expect(try row.decode("id", as: UUID.self) == id)
            let decoded = try row.decode("at", as: Date.self)
            #expect(abs(decoded.timeIntervalSince1970 - when.timeIntervalSince1970) < 0.000_001)
            #expect(try row.decode("raw", as: PostgresBytes.self) == bytes)
            let kathmandu = try row.decode("kathmandu", as: Date.self)
            #expect(kathmandu.timeIntervalSince1970 == 1_774_727_100)  // 2026-03-28 19:45:00 UTC
            let error = #expect(throws: PostgresError.self) { try row.decode("at", as: UUID.self) }
            #expect(error?.description.contains("\"at\"") == true)
            #expect(error?.description.contains("timestamptz") == true)
            #expect(error?.description.contains("UUID") == true)
        }
    }

    @Test("a unique violation surfaces as its SQLSTATE, and the description redacts bound values")
    func uniqueViolation() async throws {
        try await TestDatabase.withPool { pool in
            try await pool.query("CREATE TABLE t (k text PRIMARY KEY)")
            try await pool.query("INSERT INTO t VALUES (\("secret-key-42"))")
            let error = await #expect(throws: PostgresError.self) {
                try await pool.query("INSERT INTO t VALUES (\("secret-key-42"))")
            }
            #expect(error?.sqlState == .uniqueViolation)
            #expect(error?.constraint == "t_pkey")
            #expect(error?.detail != nil)
            #expect(error?.description.contains("secret-key-42") == false)
            #expect(error?.description.contains("23505") == true)
        }
    }

    @Test("a value the server echoes in its message is redacted from the description")
    func serverEchoIsRedacted() async throws {
        try await TestDatabase.withPool { pool in
            let error = await #expect(throws: PostgresError.self) {
                try await pool.query("SELECT \("hunter2-password")::integer")
            }
            #expect(error?.sqlState == .invalidTextRepresentation)
            #expect(error?.description.contains("hunter2") == false)
            #expect(error?.description.contains("$1") == true)
        }
    }

    @Test("withTransaction rolls back when its body throws")
    func transactionRollsBack() async throws {
        struct Boom: Error {}
        try await TestDatabase.withPool { pool in
            try await pool.query("CREATE TABLE t (n int)")
            await #expect(throws: Boom.self) {
                try await pool.withTransaction { connection in
                    try connection.query("INSERT INTO t VALUES (\(1))")
                    throw Boom()
                }
            }
            try await pool.withTransaction { _ = try $0.query("INSERT INTO t VALUES (\(2))") }
            let rows = try await pool.query("SELECT array_agg(n)::text AS ns FROM t")
            #expect(try rows[0].decode("ns", as: String.self) == "{2}")
        }
    }

    @Test("interpolated fragments are renumbered and quoted text is left alone")
    func fragmentsCompose() async throws {
        let filter: PostgresQuery = "n > \(1) AND label <> '$1'"
        var query: PostgresQuery = "SELECT count(*)::int AS c FROM (VALUES (1, 'a'), (2, 'b'), (3, '$1')) v(n, label) WHERE \(filter)"
        query.append(" AND n < \(3)")
        #expect(query.sql.contains("n > $1 AND label <> '$1'"))
        #expect(query.sql.hasSuffix("n < $2"))
        try await TestDatabase.withPool { pool in
            let rows = try await pool.query(query)
            #expect(try rows[0].decode("c", as: Int.self) == 1)
        }
    }

    @Test("renumbering shifts every placeholder outside quotes and comments, in any text")
    func renumberText() {
        let text = "SELECT $1, '$2 é', \"c$3\" -- $4 ' \n /* $5 /* $6 */ ' */ $7 || 'ü' = $10$11 ; $ $x"
        #expect(PostgresQuery.renumber(text, by: 3)
            == "SELECT $4, '$2 é', \"c$3\" -- $4 ' \n /* $5 /* $6 */ ' */ $10 || 'ü' = $13$14 ; $ $x")
        // An unclosed quote or comment runs to the end, as PostgreSQL reads it.
        #expect(PostgresQuery.renumber("$1 'open $2", by: 1) == "$2 'open $2")
        #expect(PostgresQuery.renumber("$1 -- $2", by: 1) == "$2 -- $2")
        #expect(PostgresQuery.renumber("", by: 1) == "")
    }

    @Test("a comment's apostrophe does not hide the placeholders after it from renumbering")
    func commentsInFragments() async throws {
        let filter: PostgresQuery = """
            -- the label's value, then /* a block's comment */ the bound one: 'x
            n > \(1) AND label <> \("c")
            """
        let query: PostgresQuery = "SELECT count(*)::int AS c FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(n, label) WHERE n < \(3) AND \(filter)"
        #expect(query.sql.hasSuffix("n > $2 AND label <> $3"), "\(query.sql)")
        try await TestDatabase.withPool { pool in
            let rows = try await pool.query(query)
            #expect(try rows[0].decode("c", as: Int.self) == 1)
        }
    }

    @Test("arrays bind as one parameter")
    func arraysBind() async throws {
        try await TestDatabase.withPool { pool in
            let names = ["admob", "i\"ad", "ne,nd"]
            let rows = try await pool.query("SELECT cardinality(\(array: names)::text[]) AS n, (\(array: names)::text[])[2] AS second")
            #expect(try rows[0].decode("n", as: Int.self) == 3)
            #expect(try rows[0].decode("second", as: String.self) == "i\"ad")
        }
    }
}

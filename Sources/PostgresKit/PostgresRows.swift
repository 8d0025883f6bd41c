import CLibPQ

/// The rows of one query result. Owns its `PGresult` and clears it when released.
///
/// libpq documents a `PGresult` as read-only after creation and safe to read from
/// any thread, which is why this class is `@unchecked Sendable`: nothing mutates it.
public final class PostgresRows: @unchecked Sendable, RandomAccessCollection {
    private let result: OpaquePointer
    /// Number of rows.
    public let count: Int
    /// Column names, in order.
    public let columns: [String]
    /// The rows affected by INSERT/UPDATE/DELETE/COPY, from the command tag.
    public let affectedRows: Int

    init(taking result: OpaquePointer) {
        self.result = result
        self.count = Int(PQntuples(result))
        let columnCount = PQnfields(result)
        self.columns = (0..<columnCount).map { String(cString: PQfname(result, $0)) }
        self.affectedRows = Int(String(cString: PQcmdTuples(result))) ?? 0
    }

    deinit { PQclear(result) }

    public var startIndex: Int { 0 }
    public var endIndex: Int { count }

    public subscript(position: Int) -> PostgresRow {
        precondition(position >= 0 && position < count, "row \(position) out of range 0..<\(count)")
        return PostgresRow(rows: self, index: Int32(position))
    }

    /// The index of a column by name.
    public func columnIndex(_ name: String) -> Int? { columns.firstIndex(of: name) }

    func isNull(row: Int32, column: Int32) -> Bool { PQgetisnull(result, row, column) == 1 }

    func text(row: Int32, column: Int32) -> String { String(cString: PQgetvalue(result, row, column)) }

    func withBytes<R>(row: Int32, column: Int32, _ body: (UnsafeRawBufferPointer?) throws -> R) rethrows -> R {
        let length = Int(PQgetlength(result, row, column))
        return try body(UnsafeRawBufferPointer(start: PQgetvalue(result, row, column), count: length))
    }

    func typeOID(column: Int32) -> PostgresTypeOID { PQftype(result, column) }
}

/// One row of a `PostgresRows`.
public struct PostgresRow: Sendable {
    let rows: PostgresRows
    let index: Int32

    /// Decodes column `column` (0-based) as `T`.
    public func decode<T: PostgresDecodable>(_ column: Int, as type: T.Type = T.self) throws -> T {
        guard column >= 0, column < rows.columns.count else {
            throw PostgresError(kind: .decoding, message: "column index \(column) out of range (\(rows.columns.count) columns)")
        }
        let field = Int32(column)
        if rows.isNull(row: index, column: field) {
            if T.acceptsNull, let value = T.nullValue { return value }
            throw decodingError(column: column, reason: "is NULL, which \(T.self) cannot hold")
        }
        let text = rows.text(row: index, column: field)
        guard let value = T.decodePostgres(text) else {
            throw decodingError(column: column, reason: "holds a value that is not a valid \(T.self)")
        }
        return value
    }

    /// Decodes the column named `name` as `T`.
    public func decode<T: PostgresDecodable>(_ name: String, as type: T.Type = T.self) throws -> T {
        guard let column = rows.columnIndex(name) else {
            throw PostgresError(kind: .decoding, message: "no column named \"\(name)\" in result (columns: \(rows.columns.joined(separator: ", ")))")
        }
        return try decode(column, as: type)
    }

    /// Whether column `column` is SQL NULL.
    public func isNull(_ column: Int) -> Bool { rows.isNull(row: index, column: Int32(column)) }

    /// The text of column `column` as bytes (nil for NULL), without making a String:
    /// for readers that parse or copy many values (a streamed report).
    public func withBytes<R>(_ column: Int, _ body: (UnsafeRawBufferPointer?) throws -> R) rethrows -> R {
        precondition(column >= 0 && column < rows.columns.count, "column \(column) out of range")
        let field = Int32(column)
        if rows.isNull(row: index, column: field) { return try body(nil) }
        return try rows.withBytes(row: index, column: field, body)
    }

    private func decodingError(column: Int, reason: String) -> PostgresError {
        let oid = rows.typeOID(column: Int32(column))
        return PostgresError(
            kind: .decoding,
            message: "column \"\(rows.columns[column])\" of type \(PostgresTypeNames.name(of: oid)) \(reason)"
        )
    }
}

/// Names of common built-in types, for error messages.
enum PostgresTypeNames {
    static func name(of oid: PostgresTypeOID) -> String {
        switch oid {
        case 16: "boolean"
        case 17: "bytea"
        case 20: "bigint"
        case 21: "smallint"
        case 23: "integer"
        case 25: "text"
        case 700: "real"
        case 701: "double precision"
        case 1043: "varchar"
        case 1082: "date"
        case 1114: "timestamp"
        case 1184: "timestamptz"
        case 1700: "numeric"
        case 2950: "uuid"
        case 3802: "jsonb"
        default: "oid \(oid)"
        }
    }
}

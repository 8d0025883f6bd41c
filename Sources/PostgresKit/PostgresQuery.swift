/// A SQL statement and its bound parameters.
///
/// Values can only enter through string interpolation, which turns each one into
/// a `$n` placeholder and a bind; they never become part of the SQL text:
///
///     let query: PostgresQuery = "SELECT name FROM apps WHERE app_id = \(appID)"
///
/// Identifiers or SQL fragments that cannot be parameters go through
/// `\(unsafeRaw:)` and must never come from user input.
public struct PostgresQuery: Sendable, ExpressibleByStringInterpolation {
    /// The SQL text with `$1`, `$2`, ... placeholders.
    public private(set) var sql: String
    /// The parameters, in placeholder order.
    public private(set) var binds: [PostgresBind]

    /// A query from a literal with no parameters.
    public init(stringLiteral value: String) {
        self.sql = value
        self.binds = []
    }

    /// A query built by interpolation.
    public init(stringInterpolation: StringInterpolation) {
        self.sql = stringInterpolation.sql
        self.binds = stringInterpolation.binds
    }

    /// SQL text given whole, with binds for its existing placeholders. The caller
    /// vouches that no value was concatenated into `unsafeSQL`.
    public init(unsafeSQL: String, binds: [PostgresBind] = []) {
        self.sql = unsafeSQL
        self.binds = binds
    }

    /// Appends another query, renumbering its placeholders.
    public mutating func append(_ other: PostgresQuery) {
        var interpolation = StringInterpolation(literalCapacity: 0, interpolationCount: 0)
        interpolation.sql = sql
        interpolation.binds = binds
        interpolation.appendInterpolation(other)
        sql = interpolation.sql
        binds = interpolation.binds
    }

    /// Builds the SQL text and the binds of a query.
    public struct StringInterpolation: StringInterpolationProtocol {
        var sql = ""
        var binds: [PostgresBind] = []

        public init(literalCapacity: Int, interpolationCount: Int) {
            sql.reserveCapacity(literalCapacity + interpolationCount * 3)
            binds.reserveCapacity(interpolationCount)
        }

        public mutating func appendLiteral(_ literal: String) {
            sql += literal
        }

        /// Binds a value as the next `$n`.
        public mutating func appendInterpolation<Value: PostgresEncodable>(_ value: Value) {
            binds.append(PostgresBind(value))
            sql += "$\(binds.count)"
        }

        /// Binds an optional value; nil becomes SQL NULL.
        public mutating func appendInterpolation<Value: PostgresEncodable>(_ value: Value?) {
            binds.append(PostgresBind(value))
            sql += "$\(binds.count)"
        }

        /// Binds an array as one PostgreSQL array parameter (use with `= ANY(...)` or `unnest`).
        public mutating func appendInterpolation<Value: PostgresEncodable>(array values: [Value]) {
            var bytes: [UInt8] = [UInt8(ascii: "{")]
            bytes.reserveCapacity(values.count * 24)
            var element: [UInt8] = []
            var first = true
            for value in values {
                if !first { bytes.append(UInt8(ascii: ",")) }
                first = false
                element.removeAll(keepingCapacity: true)
                value.appendPostgresText(to: &element)
                // Every element quoted: then only quotes and backslashes need escaping.
                bytes.append(UInt8(ascii: "\""))
                if element.contains(where: { $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
                    for byte in element {
                        if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { bytes.append(UInt8(ascii: "\\")) }
                        bytes.append(byte)
                    }
                } else {
                    bytes.append(contentsOf: element)
                }
                bytes.append(UInt8(ascii: "\""))
            }
            bytes.append(UInt8(ascii: "}"))
            binds.append(PostgresBind(text: String(decoding: bytes, as: UTF8.self), type: 0))
            sql += "$\(binds.count)"
        }

        /// Embeds another query, renumbering its placeholders after ours.
        public mutating func appendInterpolation(_ fragment: PostgresQuery) {
            let offset = binds.count
            if fragment.binds.isEmpty {
                sql += fragment.sql
            } else {
                sql += PostgresQuery.renumber(fragment.sql, by: offset)
            }
            binds += fragment.binds
        }

        /// Inserts SQL text as is. Only for identifiers and fragments written in code.
        public mutating func appendInterpolation(unsafeRaw text: String) {
            sql += text
        }
    }

    /// Shifts every `$n` placeholder in `sql` by `offset`, leaving quoted text and comments alone.
    static func renumber(_ sql: String, by offset: Int) -> String {
        var out = ""
        var scalars = Array(sql.unicodeScalars)[...]
        var inQuote: Unicode.Scalar?
        while let char = scalars.popFirst() {
            if let quote = inQuote {
                out.unicodeScalars.append(char)
                if char == quote { inQuote = nil }
                continue
            }
            if char == "'" || char == "\"" {
                inQuote = char
                out.unicodeScalars.append(char)
            } else if char == "-", scalars.first == "-" {
                // A line comment, kept whole: an apostrophe in it opens no quote.
                out.unicodeScalars.append(char)
                while let next = scalars.popFirst() {
                    out.unicodeScalars.append(next)
                    if next == "\n" { break }
                }
            } else if char == "/", scalars.first == "*" {
                // A block comment (PostgreSQL nests them).
                out.unicodeScalars.append(char)
                out.unicodeScalars.append(scalars.removeFirst())
                var depth = 1
                while depth > 0, let next = scalars.popFirst() {
                    out.unicodeScalars.append(next)
                    if next == "*", scalars.first == "/" { out.unicodeScalars.append(scalars.removeFirst()); depth -= 1 }
                    else if next == "/", scalars.first == "*" { out.unicodeScalars.append(scalars.removeFirst()); depth += 1 }
                }
            } else if char == "$", let first = scalars.first, ("0"..."9").contains(first) {
                var digits = ""
                while let digit = scalars.first, ("0"..."9").contains(digit) {
                    digits.unicodeScalars.append(digit)
                    scalars.removeFirst()
                }
                out += "$\(Int(digits)! + offset)"
            } else {
                out.unicodeScalars.append(char)
            }
        }
        return out
    }
}

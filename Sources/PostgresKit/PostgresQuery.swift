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
    /// Works on the UTF-8 bytes, copying the runs between placeholders whole: the report
    /// engine nests fragments several deep, and this ran over each 10 kB statement a few
    /// times per report (a scalar at a time it was a fifth of a report's CPU in the server).
    static func renumber(_ sql: String, by offset: Int) -> String {
        var text = sql
        return text.withUTF8 { source -> String in
            let count = source.count
            var out = [UInt8]()
            out.reserveCapacity(count + 16)
            // Bytes not yet copied start at `pending`.
            var pending = 0
            var index = 0
            func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
            while index < count {
                let byte = source[index]
                switch byte {
                case UInt8(ascii: "'"), UInt8(ascii: "\""):
                    // Quoted text, to its closing quote (a doubled quote closes and reopens).
                    index += 1
                    while index < count && source[index] != byte { index += 1 }
                    index += 1
                case UInt8(ascii: "-") where index + 1 < count && source[index + 1] == UInt8(ascii: "-"):
                    // A line comment, kept whole: an apostrophe in it opens no quote.
                    index += 2
                    while index < count && source[index] != UInt8(ascii: "\n") { index += 1 }
                    index += 1
                case UInt8(ascii: "/") where index + 1 < count && source[index + 1] == UInt8(ascii: "*"):
                    // A block comment (PostgreSQL nests them).
                    index += 2
                    var depth = 1
                    while depth > 0 && index < count {
                        if source[index] == UInt8(ascii: "*"), index + 1 < count, source[index + 1] == UInt8(ascii: "/") {
                            depth -= 1
                            index += 2
                        } else if source[index] == UInt8(ascii: "/"), index + 1 < count, source[index + 1] == UInt8(ascii: "*") {
                            depth += 1
                            index += 2
                        } else {
                            index += 1
                        }
                    }
                case UInt8(ascii: "$") where index + 1 < count && isDigit(source[index + 1]):
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: source[pending..<index]))
                    var number = 0
                    index += 1
                    while index < count && isDigit(source[index]) {
                        number = number * 10 + Int(source[index] - UInt8(ascii: "0"))
                        index += 1
                    }
                    out.append(contentsOf: "$\(number + offset)".utf8)
                    pending = index
                default:
                    index += 1
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: source[pending..<min(index, count)]))
            return String(decoding: out, as: UTF8.self)
        }
    }
}

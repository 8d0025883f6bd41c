/// Every failure of the PostgreSQL layer.
///
/// The description names what failed, the SQLSTATE and the server's message and
/// detail. It never contains bound parameter values or a password.
public struct PostgresError: Error, Sendable, CustomStringConvertible {
    /// What went wrong, broadly.
    public enum Kind: String, Sendable {
        /// The server could not be reached or refused the connection.
        case connectionFailed
        /// An established connection broke (server restart, network).
        case connectionLost
        /// The server rejected a statement; `sqlState` says why.
        case server
        /// A value cannot be sent as text: it contains a NUL byte (as a bound parameter
        /// or a COPY field). Only values from outside reach this; the HTTP layer answers 400.
        case invalidParameter
        /// A result value could not be decoded into the requested Swift type.
        case decoding
        /// COPY failed on the client side.
        case copy
        /// No pooled connection became free within the pool's timeout.
        case poolTimeout
        /// The pool was shut down.
        case poolClosed
    }

    /// The broad category.
    public var kind: Kind
    /// The server's SQLSTATE, when the server reported one.
    public var sqlState: SQLState?
    /// The primary message (the server's, or ours).
    public var message: String
    /// The server's DETAIL line.
    public var detail: String?
    /// The server's HINT line.
    public var hint: String?
    /// The constraint named by the server, for constraint violations.
    public var constraint: String?

    /// Creates an error.
    public init(
        kind: Kind, sqlState: SQLState? = nil, message: String,
        detail: String? = nil, hint: String? = nil, constraint: String? = nil
    ) {
        self.kind = kind
        self.sqlState = sqlState
        self.message = message
        self.detail = detail
        self.hint = hint
        self.constraint = constraint
    }

    public var description: String {
        var text = "PostgreSQL \(kind.rawValue)"
        if let sqlState { text += " [\(sqlState)]" }
        text += ": \(message)"
        if let detail { text += " (detail: \(detail))" }
        if let hint { text += " (hint: \(hint))" }
        return text
    }

    /// The same error with every bound value that the server echoed in its message
    /// or detail replaced by `$n`, so that logs never carry parameter values.
    public func redacting(_ binds: [PostgresBind]) -> PostgresError {
        var copy = self
        let values = binds.enumerated()
            .compactMap { index, bind in bind.text.flatMap { $0.isEmpty ? nil : ($0, "$\(index + 1)") } }
            .sorted { $0.0.count > $1.0.count }
        guard !values.isEmpty else { return self }
        copy.message = Self.redact(message, values)
        copy.detail = detail.map { Self.redact($0, values) }
        return copy
    }

    /// Replaces whole-token occurrences (not inside a longer word) of each value.
    static func redact(_ text: String, _ values: [(String, String)]) -> String {
        var text = text
        for (value, placeholder) in values {
            var result = ""
            var rest = Substring(text)
            while let range = rest.range(of: value) {
                let before = range.lowerBound == rest.startIndex ? result.last : rest[rest.index(before: range.lowerBound)]
                let after = range.upperBound == rest.endIndex ? nil : rest[range.upperBound]
                let isToken = !(before.map(Self.isWordCharacter) ?? false) && !(after.map(Self.isWordCharacter) ?? false)
                result += rest[..<range.lowerBound]
                result += isToken ? placeholder : String(rest[range])
                rest = rest[range.upperBound...]
            }
            text = result + rest
        }
        return text
    }

    private static func isWordCharacter(_ char: Character) -> Bool { char.isLetter || char.isNumber || char == "_" }

    /// Whether the connection that produced this error can no longer be used.
    public var isConnectionBroken: Bool { kind == .connectionLost || kind == .connectionFailed }

    /// Whether the database cannot be reached at all (as opposed to one statement
    /// failing, or the pool being busy): no connection could be made or kept.
    public var isUnreachable: Bool {
        switch kind {
        case .connectionFailed, .connectionLost, .poolClosed: return true
        default: return sqlState?.errorClass == "08"
        }
    }

    /// What a client is told of a transient error: the cause in a few words, without the
    /// server's detail (a pool waited in vain, a statement ran past its timeout, the
    /// database could not be reached, or was busy or shutting down).
    public var transientReason: String {
        if kind == .poolTimeout { return "the server is busy: every database connection for this work stayed in use for the whole wait (\(message))" }
        if sqlState == .queryCanceled { return "the query ran longer than the database's statement timeout and was cancelled" }
        if isUnreachable { return "the database is unavailable" }
        if sqlState?.errorClass == "40" { return "the transaction conflicted with another one" }
        if sqlState?.errorClass == "53" { return "the database is out of a resource (connections, memory or disk)" }
        return "the database is unavailable"
    }

    /// Whether the same work may well succeed if retried shortly: the database is
    /// unreachable, busy, shutting down, read-only after a failover, out of a
    /// resource, or the statement hit a timeout or lost a deadlock. Clients get 503
    /// with `Retry-After` for these, not 500.
    public var isTransient: Bool {
        switch kind {
        case .connectionFailed, .connectionLost, .poolTimeout, .poolClosed: return true
        case .server, .copy, .invalidParameter, .decoding: break
        }
        guard let sqlState else { return false }
        switch sqlState.errorClass {
        case "08", "53", "57": return true  // connection exception, insufficient resources, operator intervention
        case "40": return true  // serialization failure, deadlock
        default: return sqlState == .readOnlySQLTransaction
        }
    }
}

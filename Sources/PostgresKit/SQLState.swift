/// A PostgreSQL SQLSTATE error code, with named constants for the ones AdTally acts on.
///
/// The full list is in the PostgreSQL manual, appendix A. Compare against the
/// constants rather than against string literals.
public struct SQLState: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The five-character code, e.g. `23505`.
    public let rawValue: String

    /// Wraps a five-character code.
    public init(rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    /// The two-character class, e.g. `23` for integrity constraint violations.
    public var errorClass: String { String(rawValue.prefix(2)) }

    /// `23505` — a unique or primary-key constraint would be violated.
    public static let uniqueViolation = SQLState(rawValue: "23505")
    /// `23503`
    public static let foreignKeyViolation = SQLState(rawValue: "23503")
    /// `23502`
    public static let notNullViolation = SQLState(rawValue: "23502")
    /// `23514`
    public static let checkViolation = SQLState(rawValue: "23514")
    /// `22023` — a parameter value the server refuses (e.g. an unknown time zone in `set_config`).
    public static let invalidParameterValue = SQLState(rawValue: "22023")
    /// `22P02` — e.g. text that is not a valid UUID.
    public static let invalidTextRepresentation = SQLState(rawValue: "22P02")
    /// `22P03` — binary COPY data that does not fit its column type.
    public static let invalidBinaryRepresentation = SQLState(rawValue: "22P03")
    /// `22P04` — malformed COPY data.
    public static let badCopyFileFormat = SQLState(rawValue: "22P04")
    /// `22021` — e.g. a NUL byte or invalid UTF-8.
    public static let characterNotInRepertoire = SQLState(rawValue: "22021")
    /// `42P01`
    public static let undefinedTable = SQLState(rawValue: "42P01")
    /// `42703`
    public static let undefinedColumn = SQLState(rawValue: "42703")
    /// `42601`
    public static let syntaxError = SQLState(rawValue: "42601")
    /// `42P07`
    public static let duplicateTable = SQLState(rawValue: "42P07")
    /// `40001`
    public static let serializationFailure = SQLState(rawValue: "40001")
    /// `40P01`
    public static let deadlockDetected = SQLState(rawValue: "40P01")
    /// `55P03` — lock_timeout passed (or NOWAIT met a lock).
    public static let lockNotAvailable = SQLState(rawValue: "55P03")
    /// `57014` — statement_timeout or a cancel request.
    public static let queryCanceled = SQLState(rawValue: "57014")
    /// `57P01` — the server is shutting down.
    public static let adminShutdown = SQLState(rawValue: "57P01")
    /// `57P03` — the server is starting up or otherwise not accepting connections.
    public static let cannotConnectNow = SQLState(rawValue: "57P03")
    /// `08006`
    public static let connectionFailure = SQLState(rawValue: "08006")
    /// `53300`
    public static let tooManyConnections = SQLState(rawValue: "53300")
    /// `25006` — a write on a read-only server (e.g. a standby after a failover).
    public static let readOnlySQLTransaction = SQLState(rawValue: "25006")
    /// `25P02` — commands ignored until end of transaction block.
    public static let inFailedTransaction = SQLState(rawValue: "25P02")
}

import CLibPQ
import Foundation

/// One libpq connection. Every call blocks the calling thread.
///
/// Use it through `PostgresPool.withConnection`, which runs the work on the
/// pool's own threads and hands a connection to one task at a time. That single
/// owner at a time is what makes `@unchecked Sendable` sound: libpq connections may
/// move between threads but must not be used by two at once, and the pool never
/// lends one connection twice.
public final class PostgresConnection: @unchecked Sendable {
    private let handle: OpaquePointer
    /// Where the connection goes, for messages: host (or socket folder) and database.
    public let target: String
    private var isBroken = false

    /// How a connection guards against a database that stops answering: libpq's
    /// connect and TCP timeouts, and the session's statement timeout. A conninfo
    /// that sets any of the libpq ones itself wins over these.
    public struct Options: Sendable, Equatable {
        /// Longest wait to establish a connection (libpq `connect_timeout`, whole seconds, at least 2).
        public var connectTimeout: Duration?
        /// TCP keepalive: idle time before the first probe (`keepalives_idle`).
        public var keepalivesIdle: Duration?
        /// TCP keepalive: time between probes (`keepalives_interval`).
        public var keepalivesInterval: Duration?
        /// TCP keepalive: unanswered probes before the connection is dead (`keepalives_count`).
        public var keepalivesCount: Int?
        /// Longest time sent data may stay unacknowledged (`tcp_user_timeout`).
        public var tcpUserTimeout: Duration?
        /// The session's `statement_timeout`; nil or zero: none.
        public var statementTimeout: Duration?

        /// The defaults: like a reverse proxy's upstream timeouts.
        public init(
            connectTimeout: Duration? = .seconds(10), keepalivesIdle: Duration? = .seconds(30), keepalivesInterval: Duration? = .seconds(10),
            keepalivesCount: Int? = 3, tcpUserTimeout: Duration? = .seconds(60), statementTimeout: Duration? = .seconds(60)
        ) {
            self.connectTimeout = connectTimeout
            self.keepalivesIdle = keepalivesIdle
            self.keepalivesInterval = keepalivesInterval
            self.keepalivesCount = keepalivesCount
            self.tcpUserTimeout = tcpUserTimeout
            self.statementTimeout = statementTimeout
        }

        /// libpq keywords and values, placed before the conninfo so that it can override them.
        var libpqParameters: [(String, String)] {
            var parameters: [(String, String)] = []
            func seconds(_ duration: Duration) -> String { "\(max(1, duration.components.seconds))" }
            if let connectTimeout { parameters.append(("connect_timeout", "\(max(2, connectTimeout.components.seconds))")) }
            if keepalivesIdle != nil || keepalivesInterval != nil || keepalivesCount != nil { parameters.append(("keepalives", "1")) }
            if let keepalivesIdle { parameters.append(("keepalives_idle", seconds(keepalivesIdle))) }
            if let keepalivesInterval { parameters.append(("keepalives_interval", seconds(keepalivesInterval))) }
            if let keepalivesCount { parameters.append(("keepalives_count", "\(keepalivesCount)")) }
            if let tcpUserTimeout { parameters.append(("tcp_user_timeout", "\(Self.milliseconds(tcpUserTimeout))")) }
            return parameters
        }

        static func milliseconds(_ duration: Duration) -> Int64 {
            duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        }
    }

    /// Opens a connection from a `postgresql://` URL or a `key=value` conninfo string.
    ///
    /// A failure names host and database — never the password — and the libpq
    /// handle is finished before the error is thrown (by `deinit` once the object
    /// exists: finishing it here too would free it twice).
    public init(connecting conninfo: String, options: Options = Options()) throws {
        // Our defaults first, the conninfo last: libpq keeps the last value of a keyword.
        let parameters = options.libpqParameters + [("dbname", conninfo)]
        let handle = Self.withCStrings(parameters.map(\.0)) { keywords in
            Self.withCStrings(parameters.map(\.1)) { values in PQconnectdbParams(keywords, values, 1) }
        }
        guard let handle else {
            throw PostgresError(kind: .connectionFailed, message: "libpq could not allocate a connection")
        }
        let target = Self.describeTarget(handle)
        guard PQstatus(handle) == CONNECTION_OK else {
            let reason = Self.lastError(handle)
            PQfinish(handle)
            throw PostgresError(
                kind: .connectionFailed,
                message: "could not connect to PostgreSQL (\(target)): \(reason)"
            )
        }
        self.handle = handle
        self.target = target
        // Server notices (e.g. "already exists, skipping") are not errors; keep them off stderr.
        PQsetNoticeProcessor(handle, { _, _ in }, nil)
        // Fixed session settings: the text formats PostgresDecodable parses. If they
        // fail, the error propagates and deinit finishes the handle.
        let timeout = options.statementTimeout.map(Options.milliseconds) ?? 0
        try execute(unsafeSQL: """
            SET client_encoding = 'UTF8'; SET DateStyle = 'ISO, YMD';
            SET TimeZone = 'UTC'; SET bytea_output = 'hex'; SET extra_float_digits = 1;
            SET statement_timeout = \(timeout)
            """)
    }

    /// Runs `body` with a NULL-terminated array of C strings that live for the call.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers: [UnsafePointer<CChar>?] = copies.map { UnsafePointer($0) } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }

    /// The value libpq uses for a connection option (e.g. `keepalives_idle`), for tests and diagnostics.
    public func option(_ keyword: String) -> String? {
        guard let options = PQconninfo(handle) else { return nil }
        defer { PQconninfoFree(options) }
        var index = 0
        while let name = options[index].keyword {
            if String(cString: name) == keyword { return options[index].val.map { String(cString: $0) } }
            index += 1
        }
        return nil
    }

    /// Whether no transaction is open or in progress on the connection (safe to lend again).
    public var isIdle: Bool { PQtransactionStatus(handle) == PQTRANS_IDLE }

    deinit { PQfinish(handle) }

    /// Whether the connection is known to be unusable (the pool replaces such ones).
    public var isUsable: Bool {
        !isBroken && PQstatus(handle) == CONNECTION_OK
    }

    /// Reads whatever the server sent while idle and reports whether the connection
    /// still stands. A server that restarted has sent a FATAL and closed the socket;
    /// this notices that without a round trip.
    public func checkAlive() -> Bool {
        guard isUsable else { return false }
        // The first read may return the server's FATAL message and only the second
        // sees the end of the stream; both are non-blocking.
        for _ in 0..<2 where PQconsumeInput(handle) == 0 || PQstatus(handle) != CONNECTION_OK {
            isBroken = true
            return false
        }
        // Drop any notifications that arrived, so they do not pile up.
        while let notice = PQnotifies(handle) { PQfreemem(notice) }
        return true
    }

    /// The backend process id, handy in tests that terminate connections.
    public var backendPID: Int32 { PQbackendPID(handle) }

    // MARK: - Queries

    /// Runs a statement with bound parameters and returns its rows.
    @discardableResult
    public func query(_ query: PostgresQuery) throws -> PostgresRows {
        dropSent()
        let result = try withParameters(query.binds) { types, values in
            PQexecParams(handle, query.sql, Int32(query.binds.count), types, values, nil, nil, 0)
        }
        do {
            return try check(result, sql: query.sql)
        } catch let error as PostgresError {
            throw error.redacting(query.binds)
        }
    }

    /// Statements prepared on this connection, by SQL text and parameter types: their
    /// names and when each was last used (`queryPrepared`).
    private var statements: [String: (name: String, lastUse: Int)] = [:]
    private var statementClock = 0
    /// The most statements one connection keeps prepared; the least recently used goes first.
    public static let preparedStatementLimit = 32

    /// Runs a statement like `query`, but prepared once per connection and SQL text, so that
    /// PostgreSQL parses it once (and plans it once, if the session's plan_cache_mode lets
    /// its generic plan be used). For long statements run again and again: a report's page.
    @discardableResult
    public func queryPrepared(_ query: PostgresQuery) throws -> PostgresRows {
        dropSent()
        let types = query.binds.map { String($0.type) }.joined(separator: ",")
        let key = types + "|" + query.sql
        statementClock += 1
        let name: String
        if let known = statements[key] {
            name = known.name
        } else {
            if statements.count >= Self.preparedStatementLimit, let oldest = statements.min(by: { $0.value.lastUse < $1.value.lastUse }) {
                statements[oldest.key] = nil
                // Not transactional; fails only in an aborted transaction, and then the
                // statement stays until the connection closes (a pool replaces connections).
                _ = try? execute(unsafeSQL: "DEALLOCATE \(oldest.value.name)")
            }
            name = "adtally_\(statementClock)"
            let prepared = try withParameters(query.binds) { types, _ in
                PQprepare(handle, name, query.sql, Int32(query.binds.count), types)
            }
            do {
                _ = try check(prepared, sql: query.sql)
            } catch let error as PostgresError {
                throw error.redacting(query.binds)
            }
        }
        statements[key] = (name, statementClock)
        let result = try withParameters(query.binds) { _, values in
            PQexecPrepared(handle, name, Int32(query.binds.count), values, nil, nil, 0)
        }
        do {
            return try check(result, sql: query.sql)
        } catch let error as PostgresError {
            throw error.redacting(query.binds)
        }
    }

    /// Runs SQL text with no parameters; several statements separated by `;` are allowed.
    /// For migrations and fixed session commands only — never for SQL built from values.
    @discardableResult
    public func execute(unsafeSQL sql: String) throws -> PostgresRows {
        dropSent()
        return try check(PQexec(handle, sql), sql: sql)
    }

    /// The statement `send` sent and `receive` has not yet read, if any.
    public private(set) var sent: String?

    /// Sends SQL text (no parameters, written in code) without waiting for it: the caller
    /// works while PostgreSQL runs it, then `receive` waits for its rows. One at a time.
    public func send(unsafeSQL sql: String) throws {
        dropSent()
        guard PQsendQuery(handle, sql) == 1 else {
            markBrokenIfNeeded()
            throw PostgresError(kind: isUsable ? .server : .connectionLost, message: Self.lastError(handle))
        }
        sent = sql
    }

    /// Reads and drops the answer to a statement sent and never received (its caller
    /// failed): every other statement on the connection runs after it, and a connection
    /// back in its pool must not carry it.
    private func dropSent() {
        guard sent != nil else { return }
        sent = nil
        while let result = PQgetResult(handle) { PQclear(result) }
        markBrokenIfNeeded()
    }

    /// The rows of the statement `send` sent, once PostgreSQL has answered.
    public func receive() throws -> PostgresRows {
        guard let sql = sent else { preconditionFailure("nothing was sent") }
        sent = nil
        var last: OpaquePointer?
        while let result = PQgetResult(handle) {
            if let earlier = last { PQclear(earlier) }
            last = result
        }
        return try check(last, sql: sql)
    }

    /// Runs `body` inside BEGIN/COMMIT; any error rolls the transaction back and is rethrown.
    /// `begin` is the statement that starts it (e.g. with an isolation level), written in code.
    public func withTransaction<T>(begin: String = "BEGIN", _ body: (PostgresConnection) throws -> T) throws -> T {
        try execute(unsafeSQL: begin)
        let value: T
        do {
            value = try body(self)
        } catch {
            if isUsable { _ = try? execute(unsafeSQL: "ROLLBACK") }
            throw error
        }
        try execute(unsafeSQL: "COMMIT")
        return value
    }

    // MARK: - COPY

    /// Streams binary COPY data to a `COPY ... FROM STDIN (FORMAT binary)` statement and
    /// returns the rows copied.
    ///
    /// `copySQL` is written in code (e.g. `COPY events (a, b) FROM STDIN (FORMAT binary)`).
    /// Every result is drained, and a server-side failure comes back with its SQLSTATE.
    @discardableResult
    public func copyIn(unsafeSQL copySQL: String, data: PostgresCopyBuffer) throws -> Int {
        precondition(!data.hasOpenRow, "COPY buffer ends inside a row")
        dropSent()
        let start = try requireResult(PQexec(handle, copySQL), sql: copySQL)
        let startStatus = PQresultStatus(start)
        if startStatus != PGRES_COPY_IN {
            // check() clears the result and turns it into an error or unexpected success.
            _ = try check(start, sql: copySQL)
            throw PostgresError(kind: .copy, message: "statement did not start COPY FROM STDIN")
        }
        let isBinary = PQbinaryTuples(start) == 1
        PQclear(start)
        if !isBinary {
            _ = PQputCopyEnd(handle, "client sends binary COPY data only")
            while let result = PQgetResult(handle) { PQclear(result) }
            throw PostgresError(kind: .copy, message: "COPY must say (FORMAT binary): \(copySQL)")
        }

        var sendFailure: String?
        data.withBytes { buffer in
            let chunk = 1 << 16
            var offset = 0
            while offset < buffer.count {
                let length = min(chunk, buffer.count - offset)
                let sent = buffer.baseAddress!.advanced(by: offset).withMemoryRebound(to: CChar.self, capacity: length) {
                    PQputCopyData(handle, $0, Int32(length))
                }
                if sent != 1 {
                    sendFailure = Self.lastError(handle)
                    return
                }
                offset += length
            }
        }
        if sendFailure == nil {
            let sent = PostgresCopyBuffer.trailer.withUnsafeBufferPointer { trailer in
                trailer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: trailer.count) { PQputCopyData(handle, $0, Int32(trailer.count)) }
            }
            if sent != 1 { sendFailure = Self.lastError(handle) }
        }
        let endResult = PQputCopyEnd(handle, sendFailure == nil ? nil : "client failed to send COPY data")
        var copied = 0
        var failure: PostgresError?
        // Drain every result: libpq requires it before the connection can be reused.
        while let result = PQgetResult(handle) {
            defer { PQclear(result) }
            let status = PQresultStatus(result)
            if status == PGRES_COMMAND_OK {
                copied = Int(String(cString: PQcmdTuples(result))) ?? 0
            } else if failure == nil {
                failure = Self.serverError(result, fallback: Self.lastError(handle))
            }
        }
        if var failure {
            markBrokenIfNeeded()
            // The server went away mid-COPY (its FATAL arrives as the result): a
            // broken connection, not a statement the server refused.
            if !isUsable { failure.kind = .connectionLost }
            throw failure
        }
        if let sendFailure {
            markBrokenIfNeeded()
            throw PostgresError(kind: isUsable ? .copy : .connectionLost, message: "sending COPY data failed: \(sendFailure)")
        }
        if endResult != 1 {
            markBrokenIfNeeded()
            throw PostgresError(kind: .connectionLost, message: "ending COPY failed: \(Self.lastError(handle))")
        }
        return copied
    }

    // MARK: - Internals

    private func withParameters<R>(
        _ binds: [PostgresBind],
        _ body: (UnsafePointer<Oid>?, UnsafePointer<UnsafePointer<CChar>?>?) -> R
    ) throws -> R {
        if binds.isEmpty { return body(nil, nil) }
        // All parameter texts live in one buffer, NUL-terminated, owned by this call.
        var storage = [CChar]()
        var offsets = [Int?]()
        offsets.reserveCapacity(binds.count)
        for (position, bind) in binds.enumerated() {
            guard let text = bind.text else {
                offsets.append(nil)
                continue
            }
            offsets.append(storage.count)
            for byte in text.utf8 {
                if byte == 0 {
                    throw PostgresError(
                        kind: .invalidParameter,
                        message: "parameter $\(position + 1) contains a NUL byte, which PostgreSQL text cannot store"
                    )
                }
                storage.append(CChar(bitPattern: byte))
            }
            storage.append(0)
        }
        let types = binds.map { Oid($0.type) }
        return storage.withUnsafeBufferPointer { buffer in
            let pointers: [UnsafePointer<CChar>?] = offsets.map { offset in
                offset.map { buffer.baseAddress!.advanced(by: $0) }
            }
            return types.withUnsafeBufferPointer { typeBuffer in
                pointers.withUnsafeBufferPointer { body(typeBuffer.baseAddress, $0.baseAddress) }
            }
        }
    }

    private func requireResult(_ result: OpaquePointer?, sql: String) throws -> OpaquePointer {
        guard let result else {
            markBrokenIfNeeded()
            throw PostgresError(kind: isUsable ? .server : .connectionLost, message: Self.lastError(handle))
        }
        return result
    }

    /// Takes ownership of `result`: returns it wrapped on success, clears it and throws otherwise.
    private func check(_ result: OpaquePointer?, sql: String) throws -> PostgresRows {
        let result = try requireResult(result, sql: sql)
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
            return PostgresRows(taking: result)
        default:
            let error = Self.serverError(result, fallback: Self.lastError(handle))
            PQclear(result)
            markBrokenIfNeeded()
            if !isUsable {
                throw PostgresError(kind: .connectionLost, sqlState: error.sqlState, message: error.message, detail: error.detail)
            }
            throw error
        }
    }

    private func markBrokenIfNeeded() {
        if PQstatus(handle) != CONNECTION_OK { isBroken = true }
    }

    static func serverError(_ result: OpaquePointer, fallback: String) -> PostgresError {
        func field(_ code: Character) -> String? {
            guard let value = PQresultErrorField(result, Int32(code.asciiValue!)) else { return nil }
            return String(cString: value)
        }
        return PostgresError(
            kind: .server,
            sqlState: field("C").map(SQLState.init(rawValue:)),
            message: field("M") ?? fallback,
            detail: field("D"),
            hint: field("H"),
            constraint: field("n")
        )
    }

    static func lastError(_ handle: OpaquePointer) -> String {
        guard let message = PQerrorMessage(handle) else { return "unknown libpq error" }
        let text = String(cString: message).trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty ? "unknown libpq error" : text
    }

    static func describeTarget(_ handle: OpaquePointer) -> String {
        let host = PQhost(handle).map { String(cString: $0) } ?? ""
        let port = PQport(handle).map { String(cString: $0) } ?? ""
        let database = PQdb(handle).map { String(cString: $0) } ?? ""
        let hostText = host.isEmpty ? "default socket" : host
        return "host \(hostText)\(port.isEmpty ? "" : " port \(port)"), database \(database.isEmpty ? "(default)" : database)"
    }
}

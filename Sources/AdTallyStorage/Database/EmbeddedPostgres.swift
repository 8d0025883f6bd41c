import AdTallyCore
import Foundation
import Logging
import PostgresKit

/// A PostgreSQL cluster kept in a folder of the project, for running without `DATABASE_URL`.
///
/// Layout under the data folder (default `.adtally/`):
/// `pg/` the cluster, `run/` its unix socket and log, `lock` serializing starts.
/// The server listens on a private unix socket only, unless a TCP port is asked for.
/// A cluster already running is reused; only whoever started it stops it.
///
/// Nobody else on the machine gets in: the cluster's user has a generated password
/// (scram-sha-256, for the socket and TCP alike), kept in `pgpass` (mode 0600) that
/// only this user can read; the socket folder is the cluster's own (mode 0700), and
/// a fallback folder under /tmp that someone else made first is refused.
public final class EmbeddedPostgres: Sendable {
    /// The data folder.
    public let dataDirectory: URL
    /// A TCP port on 127.0.0.1 to listen on as well, or nil for the unix socket only.
    public let tcpPort: Int?
    private let binaries: URL
    private let logger: Logger

    /// The database AdTally uses inside the cluster.
    public static let databaseName = "adtally"
    /// The cluster's superuser.
    public static let userName = "adtally"
    static let socketPort = 5432

    /// Prepares (does not start) a cluster in `dataDirectory`.
    /// Throws when the PostgreSQL server programs are not installed.
    /// `binarySearchPaths` replaces PATH as the fallback after /usr/lib/postgresql/N/bin.
    public init(
        dataDirectory: URL, tcpPort: Int? = nil, serverRoot: String = "/usr/lib/postgresql", binarySearchPaths: [String]? = nil,
        logger: Logger = Logger(label: "adtally.embedded-postgres")
    ) throws {
        self.dataDirectory = dataDirectory.standardizedFileURL
        self.tcpPort = tcpPort
        self.logger = logger
        let path = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map(String.init)
        self.binaries = try Self.findBinaries(serverRoot: serverRoot, searchPaths: binarySearchPaths ?? path)
    }

    var clusterDirectory: URL { dataDirectory.appendingPathComponent("pg") }
    /// The password file libpq reads (`passfile`), mode 0600.
    public var passwordFile: URL { dataDirectory.appendingPathComponent("pgpass") }
    var runDirectory: URL { dataDirectory.appendingPathComponent("run") }
    /// The server log.
    public var logFile: URL { runDirectory.appendingPathComponent("postgres.log") }

    /// The socket folder: `run/` when its path fits a unix socket address, else one under /tmp.
    var socketDirectory: URL {
        // sun_path holds 107 bytes; the socket file name adds 17.
        if runDirectory.path.utf8.count <= 90 { return runDirectory }
        let digest = String(SHA256.hex(runDirectory.path).prefix(16))
        return URL(fileURLWithPath: "/tmp/adtally-\(digest)")
    }

    /// The libpq conninfo for the cluster's database.
    public var conninfo: String {
        "host='\(socketDirectory.path)' port=\(tcpPort ?? Self.socketPort) dbname=\(Self.databaseName) user=\(Self.userName) "
            + "passfile='\(passwordFile.path)' application_name=adtally"
    }

    /// Whether the cluster's server is running.
    public func isRunning() throws -> Bool {
        guard FileManager.default.fileExists(atPath: clusterDirectory.appendingPathComponent("PG_VERSION").path) else { return false }
        let outcome = try CommandRunner.run(tool("pg_ctl"), ["status", "-D", clusterDirectory.path], asUser: serverUser)
        return outcome.status == 0
    }

    /// Makes the cluster run: initdb on first use, start unless already running.
    /// Returns true when this call started the server (and so should stop it).
    @discardableResult
    public func start() throws -> Bool {
        try FileManager.default.createDirectory(at: dataDirectory, withIntermediateDirectories: true)
        return try withStartLock {
            try prepareDirectories()
            let password = try ensurePassword()
            if !FileManager.default.fileExists(atPath: clusterDirectory.appendingPathComponent("PG_VERSION").path) {
                try initialize(password: password)
            }
            if try isRunning() {
                logger.info("reusing the running embedded PostgreSQL", metadata: ["data": "\(dataDirectory.path)"])
                try createDatabaseIfMissing()
                return false
            }
            try writeSettings()
            let upgrading = trustsConnections()
            let outcome = try CommandRunner.run(
                tool("pg_ctl"),
                ["start", "-w", "-t", "60", "-D", clusterDirectory.path, "-l", logFile.path],
                asUser: serverUser
            )
            guard outcome.status == 0 else {
                throw EmbeddedPostgresError.startFailed(output: outcome.output, log: tailOfLog())
            }
            if upgrading { try setPasswordAndReload(password) }
            try createDatabaseIfMissing()
            logger.info("started embedded PostgreSQL", metadata: ["data": "\(dataDirectory.path)", "socket": "\(socketDirectory.path)"])
            return true
        }
    }

    /// Stops the server (fast shutdown: open transactions roll back, committed data stays).
    public func stop() throws {
        try withStartLock {
            guard try isRunning() else { return }
            let outcome = try CommandRunner.run(
                tool("pg_ctl"), ["stop", "-w", "-t", "60", "-m", "fast", "-D", clusterDirectory.path], asUser: serverUser
            )
            guard outcome.status == 0 else { throw EmbeddedPostgresError.stopFailed(output: outcome.output) }
            logger.info("stopped embedded PostgreSQL", metadata: ["data": "\(dataDirectory.path)"])
        }
    }

    /// Stops the server unless other clients are still connected to it
    /// (a server sharing the cluster keeps it); returns whether it stopped.
    @discardableResult
    public func stopIfUnused() throws -> Bool {
        var others = 0
        do {
            let connection = try PostgresConnection(connecting: conninfo)
            // A client that has just disconnected stays listed until its backend exits
            // (milliseconds): look again for up to half a second before counting it.
            for attempt in 0..<10 {
                let rows = try connection.query("""
                    SELECT count(*)::bigint AS n FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                    """)
                others = try rows[0].decode("n", as: Int.self)
                if others == 0 || attempt == 9 { break }
                usleep(50_000)
            }
        } catch {
            others = 0
        }
        if others > 0 {
            logger.info("leaving embedded PostgreSQL running: other clients use it", metadata: ["clients": "\(others)"])
            return false
        }
        try stop()
        return true
    }

    // MARK: - Internals

    /// PostgreSQL refuses to run as root; as root we run it as the `postgres` user.
    var serverUser: String? {
        geteuid() == 0 ? "postgres" : nil
    }

    private func tool(_ name: String) -> String { binaries.appendingPathComponent(name).path }

    private func prepareDirectories() throws {
        for directory in [clusterDirectory, runDirectory] {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        let owner: (uid: uid_t, gid: gid_t)
        if let user = serverUser {
            guard let entry = getpwnam(user) else { throw EmbeddedPostgresError.noServerUser(user) }
            owner = (entry.pointee.pw_uid, entry.pointee.pw_gid)
        } else {
            owner = (geteuid(), getegid())
        }
        if socketDirectory != runDirectory { try prepareSocketFallback(owner: owner.uid) }
        if serverUser != nil {
            for directory in [clusterDirectory, runDirectory, socketDirectory] {
                guard chown(directory.path, owner.uid, owner.gid) == 0 else {
                    throw EmbeddedPostgresError.cannotPrepare(directory.path, String(cString: strerror(errno)))
                }
            }
        }
        _ = chmod(clusterDirectory.path, 0o700)
        _ = chmod(runDirectory.path, 0o700)
        if let user = serverUser {
            // initdb and the server run as that user: every folder above the cluster must let it in.
            let probe = try CommandRunner.run("/usr/bin/test", ["-w", clusterDirectory.path, "-a", "-x", clusterDirectory.path], asUser: user)
            guard probe.status == 0 else { throw EmbeddedPostgresError.unreachableForServerUser(user, clusterDirectory.path) }
        }
    }

    /// The /tmp socket folder (for data folders whose path is too long for a socket
    /// address): made here with mode 0700, or, if it exists, used only when it is a
    /// real folder of the server's user (or ours) that nobody else may enter. Its
    /// name is predictable, so another user could have made it first to catch the socket.
    private func prepareSocketFallback(owner: uid_t) throws {
        let path = socketDirectory.path
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw EmbeddedPostgresError.cannotPrepare(path, String(cString: strerror(errno)))
        }
        var info = stat()
        guard lstat(path, &info) == 0 else { throw EmbeddedPostgresError.cannotPrepare(path, String(cString: strerror(errno))) }
        let isDirectory = info.st_mode & S_IFMT == S_IFDIR
        guard isDirectory, info.st_uid == owner || info.st_uid == geteuid(), info.st_mode & 0o077 == 0 else {
            throw EmbeddedPostgresError.unsafeSocketDirectory(path)
        }
    }

    /// The cluster user's password: read from `pgpass`, or generated (24 random
    /// bytes, hex) and written there with mode 0600 before the cluster first starts.
    private func ensurePassword() throws -> String {
        if let text = try? String(contentsOf: passwordFile, encoding: .utf8),
           let line = text.split(separator: "\n").first, let password = line.split(separator: ":").last, !password.isEmpty {
            _ = chmod(passwordFile.path, 0o600)
            return String(password)
        }
        var generator = SystemRandomNumberGenerator()
        let password = (0..<24).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
        try Self.writePrivately("*:*:*:\(Self.userName):\(password)\n", to: passwordFile)
        return password
    }

    /// Writes a file only its owner may read (mode 0600 from the start).
    private static func writePrivately(_ text: String, to url: URL) throws {
        let descriptor = open(url.path, O_CREAT | O_WRONLY | O_TRUNC, 0o600)
        guard descriptor >= 0 else { throw EmbeddedPostgresError.cannotPrepare(url.path, String(cString: strerror(errno))) }
        defer { close(descriptor) }
        _ = fchmod(descriptor, 0o600)
        let bytes = Array(text.utf8)
        guard write(descriptor, bytes, bytes.count) == bytes.count else {
            throw EmbeddedPostgresError.cannotPrepare(url.path, String(cString: strerror(errno)))
        }
    }

    private func initialize(password: String) throws {
        logger.info("creating embedded PostgreSQL cluster", metadata: ["data": "\(clusterDirectory.path)"])
        // initdb reads the password from a file its user can read; removed right after.
        let passwordInput = runDirectory.appendingPathComponent("initdb-password")
        try Self.writePrivately(password, to: passwordInput)
        defer { try? FileManager.default.removeItem(at: passwordInput) }
        if let user = serverUser, let entry = getpwnam(user) { _ = chown(passwordInput.path, entry.pointee.pw_uid, entry.pointee.pw_gid) }
        let outcome = try CommandRunner.run(
            tool("initdb"),
            ["-D", clusterDirectory.path, "-U", Self.userName, "--pwfile", passwordInput.path, "-A", "scram-sha-256", "-E", "UTF8",
             "--locale=C.UTF-8", "--no-instructions"],
            asUser: serverUser
        )
        guard outcome.status == 0 else { throw EmbeddedPostgresError.initdbFailed(output: outcome.output) }
        let conf = clusterDirectory.appendingPathComponent("postgresql.conf")
        let handle = try FileHandle(forWritingTo: conf)
        defer { try? handle.close() }
        handle.seekToEndOfFile()
        handle.write(Data("\n# AdTally: socket, port and listen address are set per start\ninclude_if_exists = 'adtally.conf'\n".utf8))
    }

    /// Whether pg_hba.conf still trusts connections: a cluster made by an earlier
    /// version let every local user in as superuser, over TCP too.
    private func trustsConnections() -> Bool {
        guard let text = try? String(contentsOf: clusterDirectory.appendingPathComponent("pg_hba.conf"), encoding: .utf8) else { return false }
        return text.split(separator: "\n").contains { !$0.hasPrefix("#") && $0.split(separator: " ").contains("trust") }
    }

    /// Sets the cluster user's password (the socket is still trusted at this point),
    /// then switches every rule to scram-sha-256 and reloads.
    private func setPasswordAndReload(_ password: String) throws {
        let admin = "host='\(socketDirectory.path)' port=\(tcpPort ?? Self.socketPort) dbname=postgres user=\(Self.userName)"
        let connection = try PostgresConnection(connecting: admin)
        try connection.query("SELECT set_config('password_encryption', 'scram-sha-256', false)")
        try connection.execute(unsafeSQL: "ALTER ROLE \(Self.userName) PASSWORD '\(password)'")
        let hba = clusterDirectory.appendingPathComponent("pg_hba.conf")
        let text = try String(contentsOf: hba, encoding: .utf8)
        let rewritten = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
            line.hasPrefix("#") ? String(line) : line.replacingOccurrences(of: " trust", with: " scram-sha-256")
        }.joined(separator: "\n")
        try rewritten.write(to: hba, atomically: false, encoding: .utf8)
        try connection.query("SELECT pg_reload_conf()")
        logger.notice("the embedded PostgreSQL now requires its generated password", metadata: ["passfile": "\(passwordFile.path)"])
    }

    private func writeSettings() throws {
        let listen = tcpPort == nil ? "" : "127.0.0.1"
        let settings = """
            # Written by adtally on every start of the embedded cluster.
            listen_addresses = '\(listen)'
            port = \(tcpPort ?? Self.socketPort)
            unix_socket_directories = '\(socketDirectory.path.replacingOccurrences(of: "'", with: "''"))'
            unix_socket_permissions = 0700
            max_connections = 200
            shared_buffers = 256MB
            logging_collector = off

            """
        let url = clusterDirectory.appendingPathComponent("adtally.conf")
        try settings.write(to: url, atomically: false, encoding: .utf8)
    }

    private func createDatabaseIfMissing() throws {
        let admin = "host='\(socketDirectory.path)' port=\(tcpPort ?? Self.socketPort) dbname=postgres user=\(Self.userName) passfile='\(passwordFile.path)'"
        let connection = try PostgresConnection(connecting: admin)
        let rows = try connection.query("SELECT 1 FROM pg_database WHERE datname = \(Self.databaseName)")
        if rows.isEmpty {
            try connection.execute(unsafeSQL: "CREATE DATABASE \(Self.databaseName)")
        }
    }

    private func withStartLock<T>(_ body: () throws -> T) throws -> T {
        let path = dataDirectory.appendingPathComponent("lock").path
        let descriptor = open(path, O_CREAT | O_RDWR, 0o644)
        guard descriptor >= 0 else { throw EmbeddedPostgresError.cannotPrepare(path, String(cString: strerror(errno))) }
        defer { close(descriptor) }
        guard flock(descriptor, LOCK_EX) == 0 else { throw EmbeddedPostgresError.cannotPrepare(path, String(cString: strerror(errno))) }
        defer { flock(descriptor, LOCK_UN) }
        return try body()
    }

    private func tailOfLog() -> String {
        guard let text = try? String(contentsOf: logFile, encoding: .utf8) else { return "" }
        return text.split(separator: "\n").suffix(15).joined(separator: "\n")
    }

    /// The folder of `initdb` and `pg_ctl`: the newest /usr/lib/postgresql/N/bin, else PATH.
    static func findBinaries(serverRoot root: String, searchPaths: [String]) throws -> URL {
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
            .compactMap(Int.init).sorted(by: >)
        for version in versions {
            let bin = URL(fileURLWithPath: "\(root)/\(version)/bin")
            if FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("initdb").path),
               FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("pg_ctl").path) {
                return bin
            }
        }
        for directory in searchPaths {
            let bin = URL(fileURLWithPath: directory)
            if FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("initdb").path),
               FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("pg_ctl").path) {
                return bin
            }
        }
        throw EmbeddedPostgresError.serverNotInstalled
    }
}

/// Why the embedded cluster could not be used.
public enum EmbeddedPostgresError: Error, CustomStringConvertible {
    case serverNotInstalled
    case noServerUser(String)
    case cannotPrepare(String, String)
    case initdbFailed(output: String)
    case startFailed(output: String, log: String)
    case stopFailed(output: String)
    case unsafeSocketDirectory(String)
    case unreachableForServerUser(String, String)

    public var description: String {
        switch self {
        case .serverNotInstalled:
            "PostgreSQL server programs (initdb, pg_ctl) were not found in /usr/lib/postgresql/*/bin or PATH; "
                + "install the Debian package 'postgresql' (apt-get install postgresql), or set DATABASE_URL to use an existing server"
        case .noServerUser(let user):
            "running as root, the embedded PostgreSQL must run as the '\(user)' user, which does not exist; install the Debian package 'postgresql' (it creates the user)"
        case .cannotPrepare(let path, let reason):
            "cannot prepare \(path) for the embedded PostgreSQL: \(reason)"
        case .initdbFailed(let output):
            "initdb failed: \(output)"
        case .startFailed(let output, let log):
            "the embedded PostgreSQL did not start: \(output)\n\(log)"
        case .stopFailed(let output):
            "the embedded PostgreSQL did not stop: \(output)"
        case .unsafeSocketDirectory(let path):
            "refusing the socket folder \(path): it exists and is not a folder of the cluster's user closed to everyone else "
                + "(someone else may have made it); remove it, or use a shorter --data-dir so that the socket stays inside it"
        case .unreachableForServerUser(let user, let path):
            "running as root, the embedded PostgreSQL runs as the '\(user)' user, which cannot reach \(path) "
                + "(a folder above it is closed to that user); use a --data-dir that '\(user)' can enter (e.g. /var/lib/adtally), or set DATABASE_URL"
        }
    }
}

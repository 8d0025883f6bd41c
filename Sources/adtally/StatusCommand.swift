import AdTallyApp
import AdTallyStorage
import ArgumentParser
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `adtally status`: how the service is doing — the database, ingest, rollups, the
/// running server's queue, and the export runner.
struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Database, migrations, table sizes, ingest rate, queue depth, rollup lag, the export runner and the alerts."
    )

    @OptionGroup var database: DatabaseOptions
    @Option(help: "The running server, whose /metrics give its queue depth (default http://127.0.0.1:$ADTALLY_PORT, port 8080).")
    var server: String?
    @Option(help: "table or json.") var format = OutputFormat.table

    /// What the server's /metrics said.
    struct ServerState: Encodable {
        var url: String
        var reachable: Bool
        var queueEvents: Double?
        var error: String?

        enum CodingKeys: String, CodingKey {
            case url, reachable, error, queueEvents = "ingest_queue_events"
        }
    }

    struct Output: Encodable {
        var database: ServiceStatus
        var server: ServerState
    }

    func run() async throws {
        let port = ProcessInfo.processInfo.environment["ADTALLY_PORT"].flatMap(Int.init) ?? 8080
        let url = server ?? "http://127.0.0.1:\(port)"
        let status: ServiceStatus
        do {
            // Looking must not change the schema: no migrations here.
            status = try await database.withDatabase(migrate: false) { database, _ in
                try await ServiceStatus.read(pool: database.pool, migrator: database.migrator)
            }
        } catch {
            if format == .json {
                try printJSON(["database_reachable": "false", "error": "\(error)"])
            } else {
                print("database: NOT REACHABLE — \(error)")
            }
            throw ExitCode(1)
        }
        let serverState = await Self.scrape(url)
        if format == .json { return try printJSON(Output(database: status, server: serverState)) }
        print(Self.text(status, serverState))
    }

    /// Reads the server's queue depth from its Prometheus text.
    static func scrape(_ base: String) async -> ServerState {
        var state = ServerState(url: base, reachable: false)
        guard let url = URL(string: base.hasSuffix("/") ? base + "metrics" : base + "/metrics") else {
            state.error = "not a URL"
            return state
        }
        var request = URLRequest(url: url)
        request.timeoutInterval = 3
        do {
            let (data, response) = try await URLSession.shared.data(for: request)
            guard (response as? HTTPURLResponse)?.statusCode == 200 else {
                state.error = "GET /metrics answered \((response as? HTTPURLResponse)?.statusCode ?? 0)"
                return state
            }
            state.reachable = true
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where line.hasPrefix("adtally_ingest_queue_events") {
                state.queueEvents = line.split(separator: " ").last.flatMap { Double($0) }
            }
        } catch {
            state.error = "\(error.localizedDescription)"
        }
        return state
    }

    static func bytes(_ count: Int64) -> String {
        let units = ["B", "kB", "MB", "GB", "TB"]
        var value = Double(count), unit = 0
        while value >= 1024, unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(count) B" : String(format: "%.1f %@", value, units[unit])
    }

    static func text(_ status: ServiceStatus, _ server: ServerState) -> String {
        var lines: [String] = []
        lines.append("database:    reachable, PostgreSQL \(status.serverVersion), \(bytes(status.databaseBytes))")
        lines.append("migrations:  \(status.migrationsApplied) applied" + (status.migrationsPending.isEmpty ? ", none pending" : ", PENDING: \(status.migrationsPending.joined(separator: ", "))"))
        guard status.isComplete else {
            lines.append("(the rest needs the schema of this version: run adtally migrate, or start adtally serve, which migrates)")
            lines.append("tables:")
            for table in status.biggestTables { lines.append("  \(table.name) \(bytes(table.bytes))") }
            return lines.joined(separator: "\n")
        }
        lines.append("ingest:      \(status.eventsLastMinute) events in the last minute (\(String(format: "%.1f", status.ingestEventsPerSecond))/s), \(status.eventsLastHour) in the last hour")
        if server.reachable {
            lines.append("server:      \(server.url) up, ingest queue \(server.queueEvents.map { String(Int($0)) } ?? "?") events")
        } else {
            lines.append("server:      \(server.url) not reachable (\(server.error ?? "?"))")
        }
        if let lag = status.rollupLagSeconds {
            lines.append("rollups:     \(status.pendingDeltaRows) delta rows pending, oldest \(String(format: "%.1f", lag)) s" + (lag > 60 ? " — is a server compacting?" : ""))
        } else {
            lines.append("rollups:     up to date (no pending deltas)")
        }
        if let last = status.lastCompaction {
            lines.append("compaction:  last pass by \(last.server) at \(isoText(last.at)), \(last.rows) delta rows")
        }
        if let runner = status.exportRunner {
            lines.append("exports:     runner \(runner)\(status.exportRunnerSince.map { " since \(isoText($0))" } ?? ""), \(status.exportSchedules) schedules, \(status.exportRunsFailed) failed runs")
        } else {
            lines.append("exports:     no export runner (no adtally serve is running), \(status.exportSchedules) schedules, \(status.exportRunsFailed) failed runs")
        }
        for run in status.lastRuns {
            lines.append("             \(run.schedule) \(run.slot)\(run.pass == 2 ? " final" : "") \(run.status)\(run.finishedAt.map { " at \(isoText($0))" } ?? "")\(run.error.map { ": \($0)" } ?? "")")
        }
        lines.append("alerts:      \(status.alertRules) rules, \(status.alertsFiring) firing, " + (status.alertEvaluator.map { "evaluated by \($0)" } ?? "no evaluator (no adtally serve is running)"))
        let keySetHere = !(ProcessInfo.processInfo.environment["ADTALLY_CREDENTIALS_KEY"] ?? "").isEmpty
        switch (status.credentialsKeyInDatabase, keySetHere) {
        case (true, false):
            lines.append("secrets:     encrypted with a key kept in this database (server_secrets): a dump of the database holds both the secrets (credentials, webhook URLs and secrets) and their key; set ADTALLY_CREDENTIALS_KEY")
        case (true, true):
            lines.append("secrets:     ADTALLY_CREDENTIALS_KEY is set here, but this database also holds a key (server_secrets): secrets stored by a server or command run without it are encrypted with that one, and a dump holds both")
        case (false, _):
            lines.append("secrets:     no key is kept in this database: secrets are encrypted with ADTALLY_CREDENTIALS_KEY")
        }
        if status.clientDrops.isEmpty {
            lines.append("app queues:  no events dropped unsent in the last 7 days")
        } else {
            lines.append("app queues:  events dropped unsent in the last 7 days (AdTallyKit reports):")
            for drop in status.clientDrops { lines.append("             \(drop.app) \(drop.reason) \(drop.dropped)") }
        }
        lines.append("tables:")
        for table in status.biggestTables {
            lines.append("  \(table.name.padding(toLength: 34, withPad: " ", startingAt: 0)) \(bytes(table.bytes).padding(toLength: 10, withPad: " ", startingAt: 0))\(table.partitions > 1 ? " (\(table.partitions) partitions)" : "")")
        }
        return lines.joined(separator: "\n")
    }
}

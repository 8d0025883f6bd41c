import AdTallyApp
import Foundation
import Logging

/// Output format of listing commands.
enum OutputFormat: String, CaseIterable, Sendable {
    case table, json
}

extension DatabaseOptions {
    /// Opens (and, unless told not to, migrates) the database, runs `body`, and closes it again.
    func withDatabase<T>(migrate: Bool = true, _ body: (Database, Logger) async throws -> T) async throws -> T {
        let settings = try Settings.resolve(flags: flags)
        // The CLI talks on stdout; logs stay on stderr and quiet unless asked for.
        let logger = LogSetup.bootstrap(level: logLevel == nil && ProcessInfo.processInfo.environment["LOG_LEVEL"] == nil ? .warning : settings.logLevel)
        let database = try await Database.open(settings, logger: logger)
        do {
            if migrate { try await database.migrate() }
            let value = try await body(database, logger)
            await database.close()
            return value
        } catch {
            await database.close()
            throw error
        }
    }
}

/// Prints rows as aligned columns.
func printTable(_ header: [String], _ rows: [[String]]) {
    let widths = header.indices.map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
    func line(_ cells: [String]) -> String {
        zip(cells, widths).map { $0 + String(repeating: " ", count: $1 - $0.count) }.joined(separator: "  ")
            .trimmingCharacters(in: .whitespaces)
    }
    print(line(header))
    rows.forEach { print(line($0)) }
}

/// JSON for the CLI's `--format json`.
func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    encoder.dateEncodingStrategy = .iso8601
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

/// A timestamp for tables, e.g. 2026-11-21T10:31:19Z.
func isoText(_ date: Date) -> String {
    date.formatted(.iso8601)
}

import AdTallyApp
import AdTallyStorage
import ArgumentParser
import Foundation

extension OutputFormat: ExpressibleByArgument {}

struct AppsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apps", abstract: "Create and list apps.", subcommands: [Create.self, List.self]
    )

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an app.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "App id: [a-z0-9][a-z0-9_.-]{0,63}.") var appID: String
        @Option(help: "Display name (default: the id).") var name: String?
        @Option(help: "IANA time zone for its reports (default UTC).") var timezone = "UTC"
        @Option(help: "ISO 4217 report currency (default USD).") var currency = "USD"
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let app = try await database.withDatabase { database, _ in
                try await AppStore(pool: database.pool).createApp(id: appID, name: name, timezone: timezone, currency: currency)
            }
            if format == .json { try printJSON(app) } else { print("created app \(app.id) (\(app.timezone), \(app.currency))") }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List apps.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let apps = try await database.withDatabase { database, _ in try await AppStore(pool: database.pool).listApps() }
            if format == .json { return try printJSON(apps) }
            printTable(["APP", "NAME", "TIMEZONE", "CURRENCY", "CREATED"], apps.map {
                [$0.id, $0.name, $0.timezone, $0.currency, isoText($0.createdAt)]
            })
        }
    }
}

struct KeysCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys", abstract: "Create, list and revoke API keys.", subcommands: [Create.self, List.self, Revoke.self]
    )

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a key. Its secret is shown once: the last line of output, or in the JSON."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The app the key belongs to.") var app: String?
        @Option(help: "ingest or read.") var scope: String?
        @Flag(help: "Create an admin key (manages apps and keys; belongs to no app).") var admin = false
        @Option(help: "table or json.") var format = OutputFormat.table

        func validate() throws {
            if admin {
                guard app == nil, scope == nil else { throw ValidationError("--admin takes neither --app nor --scope") }
            } else {
                guard app != nil else { throw ValidationError("--app is required (or --admin)") }
                guard let scope, ["ingest", "read"].contains(scope) else { throw ValidationError("--scope must be ingest or read") }
            }
        }

        func run() async throws {
            let keyScope: KeyScope = admin ? .admin : KeyScope(rawValue: scope ?? "") ?? .read
            let key = try await database.withDatabase { database, _ in
                try await AppStore(pool: database.pool).createKey(app: app, scope: keyScope)
            }
            if format == .json { return try printJSON(key) }
            print("created \(key.scope.rawValue) key \(key.id)\(key.app.map { " for app \($0)" } ?? "")")
            print("the secret is shown only now; store it safely:")
            print(key.secret)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List keys (never their secrets).")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this app's keys.") var app: String?
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let keys = try await database.withDatabase { database, _ in try await AppStore(pool: database.pool).listKeys(app: app) }
            if format == .json { return try printJSON(keys) }
            printTable(["KEY", "APP", "SCOPE", "CREATED", "REVOKED"], keys.map {
                [$0.id, $0.app ?? "-", $0.scope.rawValue, isoText($0.createdAt),
                 $0.revokedAt.map(isoText) ?? "-"]
            })
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a key; its secret stops working.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The key id (key_...).") var keyID: String

        func run() async throws {
            let key = try await database.withDatabase { database, _ in try await AppStore(pool: database.pool).revokeKey(keyID) }
            print("revoked key \(key.id)")
        }
    }
}

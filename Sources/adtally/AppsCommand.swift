import AdTallyApp
import AdTallyStorage
import ArgumentParser
import Foundation

extension OutputFormat: ExpressibleByArgument {}

struct AppsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apps", abstract: "Create and list apps, and name their networks.", subcommands: [Create.self, List.self, Update.self, Networks.self]
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

extension AppsCommand {
    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change an app's settings: its own retention.",
            discussion: """
                --retention-days N keeps N days of the app's raw events and device rows (when shorter than the servers' \
                --retention-days, which this command does not change); --servers-retention drops the app's own.
                """
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The app.") var appID: String
        @Flag(help: "Drop the app's own retention: the servers' applies.") var serversRetention = false
        @Option(help: "table or json.") var format = OutputFormat.table

        func validate() throws {
            if (database.retentionDays == nil) == !serversRetention {
                throw ValidationError("give --retention-days N (\(AppStore.retentionRange.lowerBound) to \(AppStore.retentionRange.upperBound)) or --servers-retention")
            }
        }

        func run() async throws {
            let days = serversRetention ? nil : database.retentionDays
            // The option names the app's retention here, not this process's.
            var options = database
            options.retentionDays = nil
            let app = try await options.withDatabase { database, _ in
                do {
                    return try await AppStore(pool: database.pool).setRetention(app: appID, days: days)
                } catch let error as AppStoreError {
                    throw ValidationError(error.description.replacingOccurrences(of: "retention_days:", with: "--retention-days:"))
                }
            }
            if format == .json { return try printJSON(app) }
            print("\(app.id): " + (app.retentionDays.map { "keeps \($0) days of raw events and device rows (or the servers' retention, when shorter)" } ?? "keeps the servers' retention"))
        }
    }

    struct Networks: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show or declare an app's networks.",
            discussion: """
                Events may name only the app's networks; any other counts as `other`. Without a declared list, the \
                first \(AppNetworks.maxPerApp) networks seen are the app's. Declare the networks wired into the app so \
                that no invented name (the ingest key ships inside the app) takes one of those places.
                """
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The app.") var appID: String
        @Option(help: "Declare the app's networks: a,b,c.") var set: String?
        @Flag(help: "Drop the declared list (the first \(AppNetworks.maxPerApp) networks seen are admitted again).") var clear = false
        @Option(help: "table or json.") var format = OutputFormat.table

        func validate() throws {
            if set != nil && clear { throw ValidationError("--set and --clear exclude each other") }
        }

        func run() async throws {
            let list = try await database.withDatabase { database, _ in
                let store = AppStore(pool: database.pool)
                do {
                    if let set { return try await store.setNetworks(app: appID, set.split(separator: ",", omittingEmptySubsequences: false).map(String.init)) }
                    if clear { return try await store.setNetworks(app: appID, nil) }
                    guard let list = try await store.networks(app: appID) else { throw AppStoreError.unknownApp(appID) }
                    return list
                } catch let error as AppStoreError {
                    throw ValidationError(error.description)
                }
            }
            if format == .json { return try printJSON(list) }
            print(list.declared == nil
                ? "\(list.app): no declared networks; admitted so far (\(list.admitted.count) of \(list.limit)): \(list.admitted.joined(separator: ", "))"
                : "\(list.app): declared networks: \(list.admitted.joined(separator: ", "))")
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

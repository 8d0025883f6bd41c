import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

extension MediationRule: ExpressibleByArgument {}

/// `adtally mediation`: the switch file apps read to pick their ad network (DESIGN §9).
struct MediationCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mediation",
        abstract: "Pick the ad network each app shows: show, set, unset, history.",
        discussion: """
            Examples:
              adtally mediation set my-app --rule automatic --networks admob,iad,nend --default admob --window-hours 24 --min-requests 1000
              adtally mediation set my-app --placement home --rule weighted --weights admob=70,iad=30
              adtally mediation set my-app --country JP --rule pinned --network nend
              adtally mediation show my-app
              adtally mediation history my-app
            Apps read GET /v1/apps/APP/mediation?placement=…&country=… with one of the app's keys.
            """,
        subcommands: [Show.self, SetPolicy.self, Unset.self, History.self]
    )

    /// The placement and country options of a scope.
    struct ScopeOptions: ParsableArguments {
        @Argument(help: "The app.") var app: String
        @Option(help: "One placement (default: every placement).") var placement: String?
        @Option(help: "One country, ISO 3166-1 alpha-2 (default: every country).") var country: String?

        var scope: MediationScope { MediationScope(app: app, placement: placement, country: country) }
    }

    /// The CLI as history names it.
    static var actor: String { "cli \(ProcessInfo.processInfo.environment["USER"] ?? "?")@\(ProcessInfo.processInfo.hostName)" }

    /// A refresher over the CLI's database, deciding as a server would.
    static func refresher(_ database: Database) -> MediationRefresher {
        MediationRefresher(store: MediationStore(pool: database.pool), engine: database.reportEngine(), configuration: .init(identity: actor))
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show an app's policies and the answer each serves.",
            discussion: "A decision older than a minute is computed again first, as a server would."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The app.") var app: String
        @Option(help: "table or json (the answers as apps get them).") var format = OutputFormat.table

        func run() async throws {
            let policies = try await database.withDatabase { database, _ in
                try await MediationCommand.refresher(database).refresh(app: app)
            }
            guard !policies.isEmpty else { return print("no mediation policy for \(app) (adtally mediation set \(app) --rule …)") }
            if format == .json {
                let answers = policies.compactMap { stored in
                    stored.decision.map { MediationAnswer.body(network: stored.chosen ?? "", answer: $0) }
                }
                return print("[" + answers.map { String(decoding: $0, as: UTF8.self) }.joined(separator: ",") + "]")
            }
            for (index, stored) in policies.enumerated() {
                if index > 0 { print("") }
                let scope = stored.policy.scope
                print("scope:     \(scope.placement.map { "placement \($0)" } ?? "every placement"), \(scope.country.map { "country \($0)" } ?? "every country")")
                print("policy:    \(stored.policy.summary)")
                guard let decision = stored.decision, let chosen = stored.chosen,
                      let answer = try? JSONSerialization.jsonObject(with: Data(decision.utf8)) as? [String: Any]
                else {
                    print("serving:   nothing yet")
                    continue
                }
                let weights = (answer["weights"] as? [String: Double] ?? [:]).sorted { $0.key < $1.key }
                print("serving:   \(chosen)" + (weights.count > 1 ? " (split: \(weights.map { "\($0.key) \(Int(($0.value * 100).rounded()))%" }.joined(separator: ", ")))" : ""))
                print("since:     \(stored.chosenSince.map(isoText) ?? "-") (decided \(stored.decidedAt.map(isoText) ?? "-"))")
                print("why:       \(answer["reason"] as? String ?? "")")
                if let window = answer["window"] as? [String: Any] {
                    print("window:    \(window["from"] as? String ?? "") to \(window["to"] as? String ?? "") (\(window["currency"] as? String ?? ""))")
                }
                let lines = answer["networks"] as? [[String: Any]] ?? []
                guard !lines.isEmpty else { continue }
                printTable(["NETWORK", "REQUESTS", "IMPRESSIONS", "FILL", "ECPM", "RPM", "TRUSTED"], lines.map { line in
                    [
                        line["network"] as? String ?? "", "\(line["requests"] as? Int ?? 0)", "\(line["impressions"] as? Int ?? 0)",
                        (line["fill_rate"] as? Double).map { String(format: "%.1f%%", $0 * 100) } ?? "-", line["ecpm"] as? String ?? "-",
                        line["rpm"] as? String ?? "-", (line["trusted"] as? Bool ?? false) ? "yes" : "no",
                    ]
                })
            }
        }
    }

    struct SetPolicy: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set",
            abstract: "Set (create or replace) a policy; it is decided and served at once.",
            discussion: "Running servers serve it within their refresh interval (--mediation-refresh, default 60 s)."
        )
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var scope: ScopeOptions
        @Option(help: "pinned, weighted or automatic.") var rule: MediationRule
        @Option(help: "pinned: the network.") var network: String?
        @Option(help: "weighted: network=weight pairs, e.g. admob=70,iad=30.") var weights: String?
        @Option(help: "automatic: the networks it may choose (default: any the app reports).") var networks: String?
        @Option(name: .customLong("default"), help: "automatic: the network served until one has enough data.") var defaultNetwork: String?
        @Option(help: "automatic: the trailing window in hours (1-168; default 24).") var windowHours = MediationPolicy.defaultWindowHours
        @Option(help: "automatic: requests a network needs in the window to be trusted (default 1000).") var minRequests = MediationPolicy.defaultMinRequests
        @Option(help: "automatic: how much better a challenger must be, as a fraction (default 0.1).") var hysteresis = MediationPolicy.defaultHysteresis
        @Option(name: .customLong("rank-by"), help: "automatic: rpm (expected revenue per 1000 requests, the default) or arpdav (revenue per daily viewer of each network's ads; --window-hours in whole days).") var rankBy = "rpm"
        @Option(help: "Seconds apps may keep the answer (Cache-Control: max-age; default 300).") var maxAge = MediationPolicy.defaultMaxAgeSeconds

        func run() async throws {
            var parsedWeights: [String: Int]?
            if let weights {
                parsedWeights = [:]
                for pair in weights.split(separator: ",") {
                    let parts = pair.split(separator: "=", maxSplits: 1)
                    guard parts.count == 2, let weight = Int(parts[1]) else { throw ValidationError("--weights: \"\(pair)\" is not network=weight") }
                    guard parsedWeights?[String(parts[0])] == nil else { throw ValidationError("--weights: \(parts[0]) is named twice") }
                    parsedWeights?[String(parts[0])] = weight
                }
            }
            guard let rank = MediationRank(rawValue: rankBy) else { throw ValidationError("--rank-by: must be rpm or arpdav") }
            let policy = MediationPolicy(
                scope: scope.scope, rule: rule, network: network, weights: parsedWeights,
                networks: networks.map { $0.split(separator: ",").map(String.init) } ?? [], defaultNetwork: defaultNetwork, windowHours: windowHours,
                minRequests: minRequests, hysteresis: hysteresis, rankBy: rank, maxAgeSeconds: maxAge
            )
            let stored = try await database.withDatabase { database, _ in
                let store = MediationStore(pool: database.pool)
                do {
                    let saved = try await store.set(policy, actor: MediationCommand.actor)
                    var policies: [StoredMediationPolicy]
                    do {
                        policies = try await MediationCommand.refresher(database).refresh(app: saved.scope.app)
                    } catch {
                        // The policy is stored: the servers decide it at their next refresh.
                        FileHandle.standardError.write(Data("warning: the policy is set, but deciding it now failed: \(error)\n".utf8))
                        policies = try await store.policies(app: saved.scope.app)
                    }
                    return policies.first { $0.policy.scope == saved.scope }
                } catch let error as FieldError {
                    throw ValidationError("--\(error.field.replacingOccurrences(of: "_", with: "-").replacingOccurrences(of: "max-age-seconds", with: "max-age")): \(error.rule)")
                } catch let error as MediationStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("policy for \(scope.scope.description) set: \(stored?.policy.summary ?? policy.summary)")
            if let stored, let chosen = stored.chosen { print("serving \(chosen)") }
        }
    }

    struct Unset: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a policy; its requests fall to a broader one (or get 404).")
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var scope: ScopeOptions

        func run() async throws {
            try await database.withDatabase { database, _ in
                do {
                    try await MediationStore(pool: database.pool).delete(scope.scope, actor: MediationCommand.actor)
                } catch let error as MediationStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("policy for \(scope.scope.description) deleted")
        }
    }

    struct History: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List an app's policy changes and network switches, newest first.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The app.") var app: String
        @Option(help: "Most entries (default 50).") var limit = 50
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            guard (1...10_000).contains(limit) else { throw ValidationError("--limit: must be a whole number from 1 to 10000") }
            let changes = try await database.withDatabase { database, _ in
                try await MediationStore(pool: database.pool).history(app: app, limit: limit)
            }
            if format == .json { return try printJSON(["changes": changes]) }
            guard !changes.isEmpty else { return print("no mediation history for \(app)") }
            printTable(["AT", "SCOPE", "KIND", "FROM", "TO", "WHY", "BY"], changes.map { change in
                let scope = MediationScope(app: app, placement: change.placement, country: change.country).qualifiers
                return [
                    isoText(change.at), scope.isEmpty ? "*" : scope,
                    change.kind, change.from ?? "-", change.to ?? "-", change.reason, change.actor,
                ]
            })
        }
    }
}

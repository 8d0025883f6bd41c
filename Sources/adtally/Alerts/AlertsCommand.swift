import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation
import PostgresKit

/// `adtally alerts`: rules on report metrics that notify a webhook when they break and
/// when they recover (DESIGN §12). A running `adtally serve` (one of them: the elected
/// evaluator) evaluates them and sends the notifications.
struct AlertsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "alerts",
        abstract: "Alert rules: create, list, show, check, pause, resume, delete, test, history.",
        discussion: """
            Examples:
              adtally alerts create admob-fill --apps my-app --metric fill_rate --filter network=admob --below 0.5 \\
                  --window-minutes 120 --min-requests 1000 --webhook https://hooks.slack.com/services/T0/B0/XYZ
              adtally alerts create revenue-drop --apps my-app,my-other-app --metric revenue --change-below -30% \\
                  --window-minutes 180 --min-requests 5000 --webhook https://ops.example.com/adtally --secret "$SECRET"
              adtally alerts check admob-fill      # what it reads now, recording and sending nothing
              adtally alerts test admob-fill
              adtally alerts history admob-fill
            A change compares the window with the same hours of the 4 same weekdays before, in each app's zone.
            Each notification is signed: X-AdTally-Signature: sha256=HMAC-SHA256(secret, body), hex.
            """,
        subcommands: [Create.self, List.self, Show.self, Check.self, Pause.self, Resume.self, Delete.self, Test.self, History.self]
    )

    /// The store, with the servers' credentials key (ADTALLY_CREDENTIALS_KEY).
    static func store(_ database: Database) -> AlertStore {
        AlertStore(pool: database.pool, key: ProcessInfo.processInfo.environment["ADTALLY_CREDENTIALS_KEY"])
    }

    /// Runs `body`, turning the store's and the rules' refusals into messages that name the option.
    static func refusing<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as AlertStoreError {
            throw ValidationError(error.description)
        } catch let error as FieldError {
            let option = [
                "name": "NAME", "threshold": "--below/--above/--change-below/--change-above", "window_minutes": "--window-minutes",
                "min_requests": "--min-requests", "every_seconds": "--every-seconds", "renotify_minutes": "--renotify-minutes",
            ][error.field] ?? (error.field.hasPrefix("filters") ? "--filter" : "--" + error.field)
            throw ValidationError("\(option): \(error.rule)")
        }
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a rule: a metric of each app, watched over the last whole hours.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Name: a-z, 0-9, - and _.") var name: String
        @Option(help: "The apps, comma-separated; each is watched on its own.") var apps: String
        @Option(help: "A report metric: fill_rate, requests, impressions, ecpm, revenue, error_rate, ctr, …") var metric: String
        @Option(name: .customLong("filter"), help: "A report filter DIMENSION=VALUE[,VALUE…] (repeatable): network=admob, country=US,CA.") var filters: [String] = []
        @Option(parsing: .unconditional, help: "Fires when the metric is below this (money in the app's currency).") var below: Double?
        @Option(parsing: .unconditional, help: "Fires when the metric is above this.") var above: Double?
        @Option(name: .customLong("change-below"), parsing: .unconditional, help: "Fires when the change against the baseline is below this: -30% (or -0.3).") var changeBelow: String?
        @Option(name: .customLong("change-above"), parsing: .unconditional, help: "Fires when the change against the baseline is above this: 50%.") var changeAbove: String?
        @Option(name: .customLong("window-minutes"), help: "The window: this many minutes of whole hours (a multiple of 60).") var windowMinutes: Int
        @Option(name: .customLong("min-requests"), help: "Below this many requests in the window the rule neither fires nor resolves (default 0).") var minRequests: Int64 = 0
        @Option(name: .customLong("every-seconds"), help: "How often it is evaluated (default 60).") var everySeconds = 60
        @Option(name: .customLong("renotify-minutes"), help: "While firing, notify again this often; 0: never (default 720).") var renotifyMinutes = 720
        @Option(help: "The webhook URL notifications are POSTed to (Slack and Mattermost incoming webhooks show their text).") var webhook: String
        @Option(help: "The webhook's signing secret (16 to 256 bytes; default: one is made and shown once). A process list shows it: prefer --secret-file.") var secret: String?
        @Option(name: .customLong("secret-file"), help: "A file holding the signing secret, or - for standard input (its trailing newline dropped).") var secretFile: String?

        func run() async throws {
            let conditions: [(AlertCondition, Double?)] = [
                (.below, below), (.above, above),
                (.changeBelow, try changeBelow.map { try Self.change($0, "--change-below") }), (.changeAbove, try changeAbove.map { try Self.change($0, "--change-above") }),
            ]
            let given = conditions.filter { $0.1 != nil }
            guard given.count == 1, let (condition, threshold) = given.first.map({ ($0.0, $0.1!) }) else {
                throw ValidationError("give exactly one of --below, --above, --change-below, --change-above")
            }
            guard let reportMetric = ReportMetric(rawValue: metric) else {
                throw ValidationError("--metric: unknown metric \"\(metric)\"; allowed: \(ReportMetric.allCases.filter { AlertRule.unwatchable($0) == nil }.map(\.rawValue).joined(separator: ", "))")
            }
            var filterMap: [String: String] = [:]
            for filter in filters {
                let parts = filter.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty, filterMap[parts[0]] == nil else {
                    throw ValidationError("--filter: must be DIMENSION=VALUE[,VALUE…], each dimension once (got \(filter))")
                }
                filterMap[parts[0]] = parts[1]
            }
            var rule = AlertRule(
                name: name, apps: apps.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }, metric: reportMetric, filters: filterMap,
                condition: condition, threshold: threshold, windowMinutes: windowMinutes, minRequests: minRequests, webhook: webhook
            )
            rule.everySeconds = everySeconds
            rule.renotifyMinutes = renotifyMinutes
            guard secret == nil || secretFile == nil else { throw ValidationError("give --secret or --secret-file, not both") }
            var secret = secret
            if let secretFile {
                // `-`: standard input.
                let data: Data
                do {
                    data = secretFile == "-" ? FileHandle.standardInput.readDataToEndOfFile() : try Data(contentsOf: URL(fileURLWithPath: secretFile))
                } catch {
                    throw ValidationError("--secret-file: cannot read \(secretFile): \(error.localizedDescription)")
                }
                secret = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .newlines)
            }
            let signing = secret
            let (saved, made) = try await database.withDatabase { database, _ in
                try await AlertsCommand.refusing {
                    try await AlertsCommand.store(database).create(rule, secret: signing, readable: try await database.reportEngine().readableApps(only: nil))
                }
            }
            print("alert rule \(saved.name) created: \(saved.metric.rawValue) \(saved.condition.describe(saved.threshold)) over \(saved.windowMinutes / 60) h, for \(saved.apps.joined(separator: ", "))")
            if let made {
                print("webhook secret (shown this once; receivers check X-AdTally-Signature with it): \(made)")
            }
        }

        static func change(_ text: String, _ option: String) throws -> Double {
            guard let value = AlertRule.parseChange(text) else { throw ValidationError("\(option): must be a change such as -30% or 50% (or a fraction, -0.3)") }
            return value
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List rules, with how many of their apps fire.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let (rules, states) = try await database.withDatabase { database, _ in
                let store = AlertsCommand.store(database)
                return (try await store.list(), try await store.states())
            }
            if format == .json { return try printJSON(["alerts": rules]) }
            guard !rules.isEmpty else { return print("no alert rules (adtally alerts create NAME --apps … --metric … --below … --window-minutes … --webhook …)") }
            let byRule = Dictionary(grouping: states, by: \.rule)
            printTable(["NAME", "APPS", "RULE", "WINDOW", "MIN REQUESTS", "STATE"], rules.map { rule in
                let firing = byRule[rule.name]?.filter { $0.state == .firing }.map(\.app) ?? []
                return [
                    rule.name, rule.apps.joined(separator: ","),
                    rule.metric.rawValue + (rule.filters.isEmpty ? "" : "{" + rule.filters.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",") + "}")
                        + " " + rule.condition.describe(rule.threshold),
                    "\(rule.windowMinutes / 60) h", "\(rule.minRequests)",
                    rule.isPaused ? "paused" : firing.isEmpty ? "ok" : "FIRING: " + firing.joined(separator: ","),
                ]
            })
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show a rule, each app's state and last numbers.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let (rule, states) = try await database.withDatabase { database, _ in
                try await AlertsCommand.refusing {
                    let store = AlertsCommand.store(database)
                    return (try await store.rule(name), try await store.states(name))
                }
            }
            if format == .json { return try printJSON(["rule": AnyEncodable(rule), "states": AnyEncodable(states)]) }
            print("name:       \(rule.name)\(rule.isPaused ? " (paused)" : "")")
            print("apps:       \(rule.apps.joined(separator: ", "))")
            print("rule:       \(rule.metric.rawValue) \(rule.condition.describe(rule.threshold))" + (rule.condition.isChange ? " against the same hours of the 4 same weekdays before" : ""))
            if !rule.filters.isEmpty { print("filters:    \(rule.filters.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))") }
            print("window:     the last \(rule.windowMinutes / 60) whole hours, at least \(rule.minRequests) requests")
            print("evaluated:  every \(rule.everySeconds) s; re-notified every " + (rule.renotifyMinutes == 0 ? "never" : "\(rule.renotifyMinutes) min") + " while firing")
            print("webhook:    \(rule.webhook)")
            guard !states.isEmpty else { return print("\nnot evaluated yet (a running adtally serve evaluates it)") }
            print("")
            printTable(["APP", "STATE", "SINCE", "VALUE", "BASELINE", "REQUESTS", "WINDOW", "NOTE"], states.map { state in
                [
                    state.app, state.state.rawValue, isoText(state.since), state.value.map(AlertRule.text) ?? "-", state.baseline.map(AlertRule.text) ?? "-",
                    state.requests.map { "\($0)" } ?? "-", state.windowFrom.map { isoText($0) + " +\(rule.windowMinutes / 60)h" } ?? "-", state.note ?? "",
                ]
            })
        }
    }

    struct Pause: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pause a rule: nothing evaluated or sent until it is resumed.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String

        func run() async throws {
            _ = try await database.withDatabase { database, _ in try await AlertsCommand.refusing { try await AlertsCommand.store(database).setPaused(name, true) } }
            print("alert rule \(name) paused")
        }
    }

    struct Resume: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Resume a paused rule.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String

        func run() async throws {
            _ = try await database.withDatabase { database, _ in try await AlertsCommand.refusing { try await AlertsCommand.store(database).setPaused(name, false) } }
            print("alert rule \(name) resumed")
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a rule, its states and its history.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String

        func run() async throws {
            try await database.withDatabase { database, _ in try await AlertsCommand.refusing { try await AlertsCommand.store(database).delete(name) } }
            print("alert rule \(name) deleted")
        }
    }

    struct Test: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send a test notification to a rule's webhook now, signed as every notification is.",
            discussion: "Exits non-zero when the webhook did not answer 2xx; the delivery is retried by the running server, with the same id."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String

        func run() async throws {
            let settings = try Settings.resolve(flags: database.flags)
            // Sent as the servers send: their link, attempts and backoff.
            var alerting = AlertEvaluator.Configuration(identity: "adtally alerts test")
            alerting.dashboardBase = settings.publicURL
            alerting.send = WebhookClient(gate: OutboundGate(policy: settings.outboundAllow)).send
            let delivery = try await database.withDatabase { database, _ in
                try await AlertsCommand.refusing { try await AlertsCommand.store(database).test(name, configuration: alerting) }
            }
            if delivery.status == "delivered" {
                print("test notification delivered to \(delivery.webhook) (HTTP \(delivery.lastStatus ?? 0), delivery \(delivery.id))")
            } else {
                throw ValidationError("test notification not delivered to \(delivery.webhook): \(delivery.error ?? delivery.status) (delivery \(delivery.id), retried by the server)")
            }
        }
    }

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Read a rule now as the evaluator would, recording and sending nothing: each app's window, numbers and what would happen.",
            discussion: "For choosing a threshold: the numbers are the report engine's, from the same report the evaluator reads."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule.") var name: String
        @Option(help: "table or json.") var format = OutputFormat.table

        /// One app's reading.
        struct Checked: Encodable {
            var app: String
            var windowFrom: Date?
            var windowTo: Date?
            var requests: Int64?
            var value: Double?
            var baseline: Double?
            var change: Double?
            var state: String
            var wouldBe: String
            var note: String?
            var readMs: Int64?

            enum CodingKeys: String, CodingKey {
                case app, requests, value, baseline, change, state, note
                case windowFrom = "window_from", windowTo = "window_to", wouldBe = "would_be", readMs = "read_ms"
            }
        }

        func run() async throws {
            let name = name
            let (rule, rows) = try await database.withDatabase { database, _ in
                try await AlertsCommand.refusing {
                    let store = AlertsCommand.store(database)
                    let rule = try await store.rule(name)
                    let states = Dictionary(try await store.states(name).map { ($0.app, $0) }, uniquingKeysWith: { a, _ in a })
                    let engine = database.reportEngine()
                    let apps = Dictionary(try await engine.readableApps(only: nil).map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
                    let evaluator = AlertEvaluator(configuration: .init(identity: "adtally alerts check"), leaderPool: database.pool, engine: engine)
                    var rows: [Checked] = []
                    for app in rule.apps {
                        let state = states[app]?.state ?? .ok
                        guard let reportApp = apps[app] else {
                            rows.append(Checked(app: app, state: state.rawValue, wouldBe: "nothing", note: "there is no app \(app)"))
                            continue
                        }
                        let now = Date()
                        let started = ContinuousClock.now
                        let reading: AlertReading
                        do {
                            reading = try await evaluator.reading(rule, app: reportApp, now: now)
                        } catch let error as PostgresError where error.isUnreachable {
                            throw error
                        } catch {
                            // What the evaluator records for it: nothing decided, and why.
                            rows.append(Checked(app: app, state: state.rawValue, wouldBe: "\(state.rawValue) (nothing sent)", note: "the report could not be read: \(error)"))
                            continue
                        }
                        let elapsed = ContinuousClock.now - started
                        let transition = AlertTransition.next(rule: rule, state: state, notifiedAt: states[app]?.notifiedAt, reading: reading, now: now)
                        rows.append(Checked(
                            app: app, windowFrom: reading.windowFrom, windowTo: reading.windowTo, requests: reading.requests, value: reading.value,
                            baseline: reading.baseline, change: reading.value.flatMap { AlertRule.change(value: $0, baseline: reading.baseline) },
                            state: state.rawValue, wouldBe: transition.map { "\($0.rawValue) (notified)" } ?? "\(state.rawValue) (nothing sent)", note: reading.note,
                            readMs: elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000
                        ))
                    }
                    return (rule, rows)
                }
            }
            if format == .json { return try printJSON(["app_readings": rows]) }
            print("rule: \(rule.metric.rawValue) \(rule.condition.describe(rule.threshold)), the last \(rule.windowMinutes / 60) whole hours, at least \(rule.minRequests) requests")
            printTable(["APP", "WINDOW FROM", "REQUESTS", "VALUE", "BASELINE", "CHANGE", "STATE", "WOULD BE", "READ MS", "NOTE"], rows.map { row in
                [
                    row.app, row.windowFrom.map(isoText) ?? "-", row.requests.map { "\($0)" } ?? "-", row.value.map(AlertRule.text) ?? "-",
                    row.baseline.map(AlertRule.text) ?? "-", row.change.map(AlertRule.percent) ?? "-", row.state, row.wouldBe,
                    row.readMs.map { "\($0)" } ?? "-", row.note ?? "",
                ]
            })
        }
    }

    struct History: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a rule's transitions and tests (or every rule's), newest first, with their deliveries.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The rule (default: every rule).") var name: String?
        @Option(help: "Most events shown.") var limit = 50
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let events = try await database.withDatabase { database, _ in
                try await AlertsCommand.refusing { try await AlertsCommand.store(database).history(name, limit: limit) }
            }
            if format == .json { return try printJSON(["events": events]) }
            guard !events.isEmpty else { return print("no alert transitions yet") }
            printTable(["AT", "RULE", "APP", "EVENT", "VALUE", "BASELINE", "REQUESTS", "WINDOW FROM", "DELIVERY"], events.map { event in
                [
                    isoText(event.at), event.rule, event.app ?? "-", event.kind, event.value.map(AlertRule.text) ?? "-", event.baseline.map(AlertRule.text) ?? "-",
                    event.requests.map { "\($0)" } ?? "-", event.windowFrom.map(isoText) ?? "-",
                    event.deliveries.map { "\($0.status) after \($0.attempts) attempt\($0.attempts == 1 ? "" : "s")" + ($0.lastStatus.map { " (HTTP \($0))" } ?? "") }
                        .joined(separator: "; "),
                ]
            })
        }
    }
}

/// Any Encodable, to print two values as one JSON object.
struct AnyEncodable: Encodable {
    let value: any Encodable
    init(_ value: any Encodable) { self.value = value }
    func encode(to encoder: any Encoder) throws { try value.encode(to: encoder) }
}

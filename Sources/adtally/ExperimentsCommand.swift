import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

extension ExperimentArm: ExpressibleByArgument {}

/// `adtally experiments`: test a mediation change on a share of devices (DESIGN §14).
struct ExperimentsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "experiments",
        abstract: "Test a mediation change on a share of devices: create, list, show, results, stop.",
        discussion: """
            Examples:
              adtally experiments create aa-home --app my-app --placement home --control pinned:admob --treatment pinned:admob --treatment-share 50
              adtally experiments create unity-home --app my-app --placement home --control pinned:admob --treatment weighted:admob=50,unity=50 --treatment-share 20
              adtally experiments create auto-home --app my-app --placement home --control pinned:admob --treatment 'automatic;default=admob;window-hours=48' --treatment-share 10 --countries US,GB
              adtally experiments results unity-home --app my-app
              adtally experiments stop unity-home --app my-app --keep treatment
            A policy is pinned:NETWORK, weighted:NETWORK=WEIGHT,… or automatic, then ;option=value
            with the options of adtally mediation set (default, networks, window-hours,
            min-requests, hysteresis, rank-by, max-age). Devices are in an experiment when
            they ask the switch for its placement with their per-install id (AdTallyKit
            sends it); a running server picks up a change within its mediation refresh
            interval (--mediation-refresh, 60 s), at once when made through the API.
            See docs/experiments.md: start with an A/A test.
            """,
        subcommands: [Create.self, List.self, Show.self, Results.self, Stop.self]
    )

    /// The experiment of that name (in `app`, or the only app that has one of that name).
    static func find(_ name: String, app: String?, store: ExperimentStore) async throws -> Experiment {
        if let app {
            do {
                return try await store.experiment(app: app, name: name)
            } catch let error as ExperimentStoreError {
                throw ValidationError(error.description)
            }
        }
        let found = try await store.named(name)
        guard found.count == 1 else {
            throw ValidationError(found.isEmpty ? "no experiment \"\(name)\"" : "apps \(found.map(\.app).joined(separator: ", ")) each have an experiment \"\(name)\": name one with --app")
        }
        return found[0]
    }

    static func printJSON(_ object: Any) throws {
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes])
        print(String(decoding: data, as: UTF8.self))
    }

    static func line(_ experiment: Experiment) -> String {
        let countries = experiment.countries.isEmpty ? "" : " in \(experiment.countries.joined(separator: ","))"
        var text = "\(experiment.name) (\(experiment.app), placement \(experiment.placement)\(countries)): \(experiment.status)"
        text += ", control \(experiment.control.spec), treatment \(experiment.treatment.spec) on \(experiment.treatmentShare)% of devices"
        if experiment.isAA { text += " (A/A)" }
        if let started = experiment.startedAt { text += ", started \(started.formatted(.iso8601)) by \(experiment.createdBy)" }
        if let stopped = experiment.stoppedAt { text += ", stopped \(stopped.formatted(.iso8601)) by \(experiment.stoppedBy ?? "?") keeping \(experiment.kept?.rawValue ?? "?")" }
        return text
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create and start an experiment on one placement of an app.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Its name: a-z, 0-9, _ . - (unique in the app, kept after it stops).") var name: String
        @Option(help: "The app.") var app: String
        @Option(help: "The placement tested.") var placement: String
        @Option(help: "The control arm's policy (pinned:admob, weighted:admob=70,unity=30, automatic;default=admob).") var control: String
        @Option(help: "The treatment arm's policy (the same as --control for an A/A test).") var treatment: String
        @Option(help: "Percent of devices in the treatment: 10, 20 or 50.") var treatmentShare: Int
        @Option(help: "Only devices asking from these countries (ISO 3166-1 alpha-2, comma-separated; default every country).") var countries: String?

        /// The experiment the options describe (each policy parsed; the rest is checked by the store).
        func makeExperiment() throws -> Experiment {
            // Each arm's scope is set by the experiment's validation.
            let scope = MediationScope(app: app, placement: placement)
            func parse(_ text: String, _ option: String) throws -> MediationPolicy {
                switch Result(catching: { () throws(FieldError) in try MediationPolicy.parse(text, scope: scope, field: option) }) {
                case .success(let policy): return policy
                case .failure(let error): throw ValidationError(error.description)
                }
            }
            return Experiment(
                name: name, app: app, placement: placement, countries: countries?.split(separator: ",").map(String.init) ?? [],
                control: try parse(control, "--control"), treatment: try parse(treatment, "--treatment"), treatmentShare: treatmentShare
            )
        }

        func run() async throws {
            let experiment = try makeExperiment()
            let created = try await database.withDatabase { database, _ in
                do {
                    let created = try await ExperimentStore(pool: database.pool).create(experiment, actor: MediationCommand.actor)
                    // Decide the arms now, as a server would (automatic ones read their window).
                    _ = try? await MediationCommand.refresher(database).refresh(app: app)
                    return created
                } catch let error as FieldError {
                    throw ValidationError("--\(error.field.replacingOccurrences(of: "_", with: "-")): \(error.rule)")
                } catch let error as ExperimentStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("started: " + ExperimentsCommand.line(created))
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List an app's experiments, running first.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The app.") var app: String
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let experiments = try await database.withDatabase { database, _ in try await ExperimentStore(pool: database.pool).list(app: app) }
            if format == .json { return try ExperimentsCommand.printJSON(["experiments": experiments.map { $0.jsonObject() }]) }
            if experiments.isEmpty { return print("no experiments in \(app)") }
            for experiment in experiments { print(ExperimentsCommand.line(experiment)) }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one experiment, with the decision it was stopped on.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The experiment.") var name: String
        @Option(help: "The app (default: the only app with an experiment of that name).") var app: String?

        func run() async throws {
            let experiment = try await database.withDatabase { database, _ in try await ExperimentsCommand.find(name, app: app, store: ExperimentStore(pool: database.pool)) }
            try ExperimentsCommand.printJSON(experiment.jsonObject())
        }
    }

    struct Results: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "The results per arm with 95 % intervals, the lift, the sample-ratio check and the verdict.",
            discussion: "The same numbers as GET /v1/apps/APP/experiments/NAME/results (the report engine's)."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The experiment.") var name: String
        @Option(help: "The app (default: the only app with an experiment of that name).") var app: String?
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let results = try await database.withDatabase { database, _ in
                let experiment = try await ExperimentsCommand.find(name, app: app, store: ExperimentStore(pool: database.pool))
                let engine = database.reportEngine()
                guard let reportApp = try await engine.readableApps(only: experiment.app).first else { throw ValidationError("no app \"\(experiment.app)\"") }
                return try await engine.experimentResults(experiment, app: reportApp)
            }
            if format == .json { return try ExperimentsCommand.printJSON(results.jsonObject()) }
            print(ExperimentsCommand.table(results))
        }
    }

    struct Stop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Stop an experiment: the kept arm's policy becomes the placement's policy; the decision is recorded with the results it was made on."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The experiment.") var name: String
        @Option(help: "The app (default: the only app with an experiment of that name).") var app: String?
        @Option(help: "control or treatment.") var keep: ExperimentArm

        func run() async throws {
            let stopped = try await database.withDatabase { database, _ in
                let store = ExperimentStore(pool: database.pool)
                let experiment = try await ExperimentsCommand.find(name, app: app, store: store)
                let decision = await database.reportEngine().stopDecision(experiment)
                do {
                    let stopped = try await store.stop(
                        app: experiment.app, name: name, keep: keep, actor: MediationCommand.actor, decision: decision.json
                    )
                    _ = try? await MediationCommand.refresher(database).refresh(app: experiment.app)
                    return (stopped, decision.verdict)
                } catch let error as ExperimentStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("stopped: " + ExperimentsCommand.line(stopped.0))
            print("decided on: " + stopped.1)
        }
    }

    /// The results as a table: one line per metric, both arms and the lift.
    static func table(_ results: ExperimentResults) -> String {
        func number(_ value: Double?, _ digits: Int = 4) -> String {
            guard let value, value.isFinite else { return "-" }
            return String(format: "%.\(digits)f", value)
        }
        func interval(_ estimate: Estimate?) -> String {
            guard let estimate, estimate.value != nil else { return "-" }
            return "\(number(estimate.value)) [\(number(estimate.low)), \(number(estimate.high))]"
        }
        func percent(_ value: Double?) -> String { value.map { String(format: "%+.1f%%", $0 * 100) } ?? "-" }
        var lines = [
            "\(results.experiment.name): \(results.experiment.app), placement \(results.experiment.placement), \(results.experiment.treatmentShare)% treatment, "
                + "\(ReportQuery.formatDate(results.from))…\(ReportQuery.formatDate(results.to))\(results.partialDay ? " (today under way)" : ""), \(results.wholeDays) whole days, \(results.currency)",
            "",
        ]
        var rows = [["metric", "control", "treatment", "lift", "significant"]]
        rows.append(["devices", "\(Int(results.moments[.control]!.n))", "\(Int(results.moments[.treatment]!.n))", "", ""])
        for metric in ExperimentStatistics.metrics {
            let lift = results.lifts[metric]
            rows.append([
                metric, interval(results.estimates[.control]?[metric]), interval(results.estimates[.treatment]?[metric]),
                lift.map { "\(percent($0.value)) [\(percent($0.low)), \(percent($0.high))]" } ?? "-", lift.map { $0.isSignificant ? "yes" : "no" } ?? "-",
            ])
        }
        if !results.projected.isEmpty {
            rows.append(["projected_monthly_revenue", interval(results.projected[.control]), interval(results.projected[.treatment]), "", ""])
        }
        let widths = (0..<5).map { column in rows.map { $0[column].count }.max() ?? 0 }
        for row in rows {
            lines.append(row.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }.joined(separator: "  "))
        }
        lines.append("")
        lines.append(String(format: "sample ratio: χ² %.2f, p %.3g%@", results.sampleRatio.chi2, results.sampleRatio.p, results.sampleRatio.isBroken ? " — BROKEN SPLIT" : ""))
        lines.append("verdict: \(results.verdict)")
        return lines.joined(separator: "\n")
    }
}

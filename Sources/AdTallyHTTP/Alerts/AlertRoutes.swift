import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird

/// Alert rules over HTTP (DESIGN §12), admin keys only:
///
/// - `GET /v1/alerts` (rules with their apps' states); `POST /v1/alerts` (201 with the
///   rule, and the webhook secret when AdTally made it: shown this once);
/// - `GET /v1/alerts/{name}`, `DELETE /v1/alerts/{name}`;
/// - `POST /v1/alerts/{name}/pause`, `/resume`, `/test` (a test notification sent now:
///   the delivery as it stands after the attempt);
/// - `GET /v1/alerts/{name}/history?limit=` and `GET /v1/alerts/history` for every rule.
public struct AlertRoutes: Sendable {
    let store: AlertStore
    let engine: ReportEngine
    let authenticator: KeyAuthenticator
    /// How the evaluator sends (test notifications go out the same way).
    let alerting: AlertEvaluator.Configuration

    public init(store: AlertStore, engine: ReportEngine, authenticator: KeyAuthenticator, alerting: AlertEvaluator.Configuration) {
        self.store = store
        self.engine = engine
        self.authenticator = authenticator
        self.alerting = alerting
    }

    struct CreateBody: Decodable {
        var name: String
        var apps: [String]
        var metric: String
        var filters: [String: String]?
        var condition: String
        var threshold: Double
        var windowMinutes: Int
        var minRequests: Int64?
        var everySeconds: Int?
        var renotifyMinutes: Int?
        var webhook: String
        var secret: String?
        var paused: Bool?

        enum CodingKeys: String, CodingKey {
            case name, apps, metric, filters, condition, threshold, webhook, secret, paused
            case windowMinutes = "window_minutes", minRequests = "min_requests", everySeconds = "every_seconds", renotifyMinutes = "renotify_minutes"
        }
    }

    /// A rule and its apps' states.
    struct Shown: Encodable {
        var rule: AlertRule
        var states: [AlertStatus]

        func encode(to encoder: any Encoder) throws {
            try rule.encode(to: encoder)
            var container = encoder.container(keyedBy: Key.self)
            try container.encode(states, forKey: Key(stringValue: "states")!)
        }

        struct Key: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init?(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }
    }

    struct Created: Encodable {
        var rule: AlertRule
        var secret: String?
    }

    /// The rule a body describes (a 400 naming the field otherwise).
    static func rule(_ body: CreateBody) throws -> AlertRule {
        guard let metric = ReportMetric(rawValue: body.metric) else {
            throw FieldError("metric", "unknown metric \"\(body.metric)\"; allowed: \(ReportMetric.allCases.filter { AlertRule.unwatchable($0) == nil }.map(\.rawValue).joined(separator: ", "))")
        }
        guard let condition = AlertCondition(rawValue: body.condition) else {
            throw FieldError("condition", "must be below, above, change_below or change_above")
        }
        var rule = AlertRule(
            name: body.name, apps: body.apps, metric: metric, filters: body.filters ?? [:], condition: condition, threshold: body.threshold,
            windowMinutes: body.windowMinutes, minRequests: body.minRequests ?? 0, webhook: body.webhook
        )
        if let every = body.everySeconds { rule.everySeconds = every }
        if let renotify = body.renotifyMinutes { rule.renotifyMinutes = renotify }
        rule.isPaused = body.paused ?? false
        return rule
    }

    public func register(on router: Routes) {
        router.get("v1/alerts") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let states = Dictionary(grouping: try await store.states(), by: \.rule)
            return try AdminRoutes.json(["alerts": try await store.list().map { Shown(rule: $0, states: states[$0.name] ?? []) }])
        }
        router.post("v1/alerts") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let body: CreateBody = try await AdminRoutes.decode(request)
            let rule = try Self.rule(body)
            return try await Self.mapping {
                let created = try await store.create(rule, secret: body.secret, readable: try await engine.readableApps(only: nil))
                return try AdminRoutes.json(Created(rule: created.rule, secret: created.madeSecret), status: .created)
            }
        }
        router.get("v1/alerts/history") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["events": try await store.history(nil, limit: try ExportRoutes.limit(request))])
        }
        router.get("v1/alerts/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            return try await Self.mapping { try AdminRoutes.json(Shown(rule: try await store.rule(name), states: try await store.states(name))) }
        }
        router.delete("v1/alerts/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            return try await Self.mapping {
                try await store.delete(name)
                return Response(status: .noContent)
            }
        }
        for (action, paused) in [("pause", true), ("resume", false)] {
            router.post("v1/alerts/:name/\(action)") { request, context in
                _ = try await authenticator.require(.admin, request)
                let name = try context.parameters.require("name")
                return try await Self.mapping { try AdminRoutes.json(try await store.setPaused(name, paused)) }
            }
        }
        router.post("v1/alerts/:name/test") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            return try await Self.mapping { try AdminRoutes.json(["delivery": try await store.test(name, configuration: alerting)]) }
        }
        router.get("v1/alerts/:name/history") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            let limit = try ExportRoutes.limit(request)
            return try await Self.mapping { try AdminRoutes.json(["events": try await store.history(name, limit: limit)]) }
        }
    }

    /// Maps the store's refusals onto problems.
    static func mapping(_ body: () async throws -> Response) async throws -> Response {
        do {
            return try await body()
        } catch let error as AlertStoreError {
            switch error {
            case .exists: throw ProblemDetails(.conflict, detail: error.description)
            case .unknown: throw ProblemDetails(.notFound, detail: error.description)
            }
        }
    }
}

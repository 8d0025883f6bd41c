import AdTallyStorage
import Foundation
import Hummingbird
import Metrics

/// `POST /v1/client-drops` (an ingest key): an app's queue tells how many events it
/// dropped unsent (DESIGN §10), each report once by its id, so no loss is silent.
/// Counted per reason in `adtally_client_dropped_events_total` and listed by `adtally status`.
public struct ClientDropRoutes: Sendable {
    let store: ClientDropStore
    let authenticator: KeyAuthenticator

    /// Creates the route.
    public init(store: ClientDropStore, authenticator: KeyAuthenticator) {
        self.store = store
        self.authenticator = authenticator
    }

    struct Report: Decodable {
        var id: String
        var reason: String
        var dropped: Int64
    }

    /// Adds the route to a router.
    public func register(on router: Routes) {
        router.post("v1/client-drops") { request, _ in
            let key = try await authenticator.require(.ingest, request)
            guard let app = key.app else { throw ProblemDetails(.forbidden, detail: "an ingest key must belong to an app") }
            let report: Report = try await AdminRoutes.decode(request, upTo: 1024)
            guard let id = UUID(uuidString: report.id) else { throw ProblemDetails(.badRequest, detail: "id: must be a UUID") }
            guard ClientDropStore.reasons.contains(report.reason) else {
                throw ProblemDetails(.badRequest, detail: "reason: must be one of \(ClientDropStore.reasons.joined(separator: ", "))")
            }
            guard (1...ClientDropStore.maxDropped).contains(report.dropped) else {
                throw ProblemDetails(.badRequest, detail: "dropped: must be a whole number from 1 to \(ClientDropStore.maxDropped)")
            }
            let recorded = try await store.record(app: app, id: id, reason: report.reason, dropped: report.dropped)
            if recorded {
                Counter(label: "adtally_client_dropped_events_total", dimensions: [("reason", report.reason)]).increment(by: Int(report.dropped))
            }
            return try AdminRoutes.json(["recorded": recorded])
        }
    }
}

import AdTallyApp
import Foundation
import HummingbirdTesting
import Testing

@Suite("Health and readiness over HTTP")
struct HealthTests {
    @Test("/healthz answers 200 while the process is up")
    func healthz() async throws {
        try await withTestApp { _, client in
            try await client.execute(uri: "/healthz", method: .get) { response in
                #expect(response.status == .ok)
                #expect(String(buffer: response.body) == #"{"status":"ok"}"#)
            }
        }
    }

    @Test("/readyz is 200 once the database is migrated")
    func readyWhenMigrated() async throws {
        try await withTestApp { _, client in
            try await client.execute(uri: "/readyz", method: .get) { response in
                #expect(response.status == .ok)
            }
        }
    }

    @Test("/readyz is 503 problem+json naming the pending migrations before migrating")
    func notReadyBeforeMigrations() async throws {
        try await withTestApp(migrate: false) { services, client in
            try await client.execute(uri: "/readyz", method: .get) { response in
                #expect(response.status == .serviceUnavailable)
                #expect(response.headers[.contentType] == "application/problem+json")
                #expect(response.headers[.retryAfter] != nil)
                let body = String(buffer: response.body)
                #expect(body.contains("0001_initial.sql"))
                #expect(body.contains("\"status\":503"))
            }
            try await services.database.migrate()
            // Ready once the background work has caught up with the migrated schema: a
            // migrate that ran past a minute (141 s in a loaded clean-clone run) left the
            // compactor failing for over a minute on the missing tables, which /readyz
            // reports until its next pass (every 5 s) succeeds.
            try await waitUntil("/readyz is 200 after migrating", within: 60) {
                try await client.execute(uri: "/readyz", method: .get) { $0.status == .ok }
            }
        }
    }

    @Test("an unknown route is a 404 problem+json")
    func unknownRoute() async throws {
        try await withTestApp { _, client in
            try await client.execute(uri: "/v1/nothing-here", method: .get) { response in
                #expect(response.status == .notFound)
                #expect(response.headers[.contentType] == "application/problem+json")
                #expect(String(buffer: response.body).contains("/v1/nothing-here"))
            }
        }
    }
}

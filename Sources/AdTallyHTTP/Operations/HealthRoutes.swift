import Hummingbird

/// What `/readyz` asks of the rest of the system.
public protocol ReadinessProbe: Sendable {
    /// Nil when ready; otherwise why not (e.g. "database unreachable: ...").
    func notReadyReason() async -> String?
}

/// `/healthz` (the process is up) and `/readyz` (database reachable and migrated).
public struct HealthRoutes: Sendable {
    let readiness: any ReadinessProbe

    /// Creates the routes around a readiness probe.
    public init(readiness: any ReadinessProbe) {
        self.readiness = readiness
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("healthz") { _, _ in
            Self.json(#"{"status":"ok"}"#)
        }
        router.get("readyz") { _, _ in
            if let reason = await readiness.notReadyReason() {
                throw ProblemDetails(.serviceUnavailable, title: "Not ready", detail: reason, headers: [.retryAfter: "5"])
            }
            return Self.json(#"{"status":"ready"}"#)
        }
    }

    static func json(_ text: String) -> Response {
        Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}

import AdTallyHTTP
import Hummingbird
import Metrics
import Prometheus

/// Process-wide Prometheus metrics behind `/metrics`.
enum MetricsRoutes {
    static let registry = PrometheusCollectorRegistry()

    /// swift-metrics can be bootstrapped once per process; tests build many apps.
    private static let bootstrapped: Void = {
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
    }()

    /// Points swift-metrics at the registry; must run before any metric is created
    /// (a Counter made earlier keeps a no-op handler for good), so `AppServices` calls it first.
    static func bootstrapOnce() { _ = bootstrapped }

    static func register(on router: Routes) {
        bootstrapOnce()
        router.get("metrics") { _, _ in
            var buffer: [UInt8] = []
            buffer.reserveCapacity(16 * 1024)
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer))
            )
        }
    }
}

import AdTallyHTTP
import CoreMetrics
import Hummingbird
import Metrics
import Prometheus

/// Process-wide Prometheus metrics behind `/metrics`.
enum MetricsRoutes {
    static let registry = PrometheusCollectorRegistry()

    /// swift-metrics can be bootstrapped once per process; tests build many apps.
    private static let bootstrapped: Void = {
        MetricsSystem.bootstrap(DescribedMetricsFactory(registry: registry))
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

/// swift-metrics onto the Prometheus registry, every metric with its HELP text and a
/// name Prometheus's conventions accept (`promtool check metrics`): counters end in
/// `_total`, durations in `_seconds`. Hummingbird's own metrics are renamed here
/// (`hb.requests` is `hb_requests_total`); AdTally's are named so at their source.
struct DescribedMetricsFactory: MetricsFactory {
    let registry: PrometheusCollectorRegistry

    /// Name and HELP text per swift-metrics label.
    static let described: [String: (name: String, help: String)] = [
        "hb.requests": ("hb_requests_total", "HTTP requests answered, by method, route and status code."),
        "hb.request.errors": ("hb_request_errors_total", "HTTP requests whose handler threw (answered with a problem), by method, route and error."),
        "http.server.request.duration": ("http_server_request_duration_seconds", "Time from a request's head to its response, by method, route and status code."),
        "http.server.active_requests": ("http_server_active_requests", "HTTP requests being answered now, by method."),
        "adtally_alert_deliveries_total": ("adtally_alert_deliveries_total", "Alert webhook delivery attempts this server made, by outcome (delivered, retrying, failed)."),
        "adtally_alert_evaluation_failures_total": ("adtally_alert_evaluation_failures_total", "Alert rule evaluations whose report could not be read (nothing decided)."),
        "adtally_alert_transitions_total": ("adtally_alert_transitions_total", "Alert state transitions this server recorded, by kind (firing, resolved, renotify)."),
        "adtally_alert_evaluator_leader": ("adtally_alert_evaluator_leader", "1 while this server evaluates the alert rules, else 0."),
        "adtally_client_dropped_events_total": ("adtally_client_dropped_events_total", "Events AdTallyKit clients reported they dropped (queue full, too old), by app and reason."),
        "adtally_erasures_total": ("adtally_erasures_total", "Erasure jobs (DESIGN §15) this server finished, by outcome (done, failed: after every retry)."),
        "adtally_erased_rows_total": ("adtally_erased_rows_total", "Rows erasure jobs removed (raw events, installs, their day and money rows, pending deltas)."),
        "adtally_export_runs_total": ("adtally_export_runs_total", "Scheduled export runs this server finished, by outcome."),
        "adtally_ingest_events_total": ("adtally_ingest_events_total", "Events ingested and committed, by outcome (accepted, duplicate, erased: an erased device's, not stored)."),
        "adtally_ingest_claim_redos_total": ("adtally_ingest_claim_redos_total", "Ingest transactions done again because an id said to be new (AdTally-Attempt: 1) or raced in was already in the ledger."),
        "adtally_ingest_refusals_total": ("adtally_ingest_refusals_total", "Ingest requests refused, by reason (invalid, overloaded, unauthorized, too large …)."),
        "adtally_experiment_exposures_total": ("adtally_experiment_exposures_total", "Devices' first exposures to experiments written (one per device and experiment; a device a server remembered is not written again)."),
        "adtally_experiment_exposures_deferred_total": ("adtally_experiment_exposures_deferred_total", "Exposures not queued because the queue was full (the device's next switch request queues it again)."),
        "adtally_experiment_exposures_refused_total": ("adtally_experiment_exposures_refused_total", "Exposures the database refused as bad data, dropped and logged (not retried)."),
        "adtally_mediation_decisions_total": ("adtally_mediation_decisions_total", "Mediation switch decisions made, by how they were decided."),
        "adtally_mediation_unreadable_numbers_total": ("adtally_mediation_unreadable_numbers_total", "Mediation refreshes whose report numbers could not be read (the last decision kept)."),
        "adtally_report_reads_total": ("adtally_report_reads_total", "Reports read, by server (primary or replica)."),
        "adtally_rollup_compaction_failures_total": ("adtally_rollup_compaction_failures_total", "Rollup compaction passes that failed."),
        "adtally_rollup_compaction_timeouts_total": ("adtally_rollup_compaction_timeouts_total", "Rollup compaction passes cut by their own timeout and tried again at once with a quarter of their rows."),
        "adtally_rollup_delta_rows_compacted_total": ("adtally_rollup_delta_rows_compacted_total", "Rollup delta rows folded into the compacted grains."),
        "adtally_rollup_reprice_failures_total": ("adtally_rollup_reprice_failures_total", "Re-pricing passes after a rate card change that failed."),
        "adtally_export_runner_leader": ("adtally_export_runner_leader", "1 while this server leads the export runner (exports and network pulls), else 0."),
        "adtally_ingest_queue_limit_events": ("adtally_ingest_queue_limit_events", "Events this server's ingest queue holds at most; past it, ingest answers 503."),
        "adtally_ingest_queue_events": ("adtally_ingest_queue_events", "Events waiting in this server's ingest queue."),
        "adtally_replica_max_lag_seconds": ("adtally_replica_max_lag_seconds", "The replay lag past which reports skip the replica for the primary (ADTALLY_READ_MAX_LAG_SECONDS); only with a replica."),
        "adtally_replica_lag_seconds": ("adtally_replica_lag_seconds", "The report replica's replay lag at the last probe, in seconds."),
        "adtally_rollup_lag_seconds": ("adtally_rollup_lag_seconds", "Age of the oldest rollup delta not yet compacted, in seconds."),
        "adtally_ingest_flush_seconds": ("adtally_ingest_flush_seconds", "Time to commit one ingest batch."),
        "adtally_report_series_refresh_seconds": ("adtally_report_series_refresh_seconds", "Time of one Grafana report series refresh pass."),
        "adtally_rollup_compaction_seconds": ("adtally_rollup_compaction_seconds", "Time of one rollup compaction pass."),
        "adtally_rollup_reprice_chunk_seconds": ("adtally_rollup_reprice_chunk_seconds", "Time of one re-pricing chunk after a rate card change."),
    ]

    /// The name and HELP text of a label (one not listed keeps its name, sanitized, with a plain HELP).
    static func describe(_ label: String) -> (name: String, help: String) {
        described[label] ?? (label, "AdTally metric \(label).")
    }

    /// swift-prometheus's own default buckets.
    static let durationBuckets = PrometheusMetricsFactory().defaultDurationHistogramBuckets
    static let valueBuckets = PrometheusMetricsFactory().defaultValueHistogramBuckets

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        let (name, help) = Self.describe(label)
        return registry.makeCounter(name: name, labels: dimensions, help: help)
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        let (name, help) = Self.describe(label)
        return registry.makeCounter(name: name, labels: dimensions, help: help)
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        let (name, help) = Self.describe(label)
        guard aggregate else { return registry.makeGauge(name: name, labels: dimensions, help: help) }
        return registry.makeValueHistogram(name: name, labels: dimensions, buckets: Self.valueBuckets, help: help)
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        let (name, help) = Self.describe(label)
        return registry.makeGauge(name: name, labels: dimensions, help: help)
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        let (name, help) = Self.describe(label)
        return registry.makeDurationHistogram(name: name, labels: dimensions, buckets: Self.durationBuckets, help: help)
    }

    func destroyCounter(_ handler: any CounterHandler) {
        if let counter = handler as? Prometheus.Counter { registry.unregisterCounter(counter) }
    }

    func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {
        if let counter = handler as? Prometheus.Counter { registry.unregisterCounter(counter) }
    }

    func destroyRecorder(_ handler: any RecorderHandler) {
        if let gauge = handler as? Prometheus.Gauge { registry.unregisterGauge(gauge) }
        if let histogram = handler as? Prometheus.ValueHistogram { registry.unregisterValueHistogram(histogram) }
    }

    func destroyMeter(_ handler: any MeterHandler) {
        if let gauge = handler as? Prometheus.Gauge { registry.unregisterGauge(gauge) }
    }

    func destroyTimer(_ handler: any TimerHandler) {
        if let histogram = handler as? Prometheus.DurationHistogram { registry.unregisterDurationHistogram(histogram) }
    }
}

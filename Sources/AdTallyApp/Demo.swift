import AdTallyCore
import AdTallyStorage
import Foundation
import Logging
import TextFormats

/// `adtally demo`: a few apps in different zones and currencies, a rate card, FX
/// rates and weeks of traffic that looks like the real thing — a daily rhythm,
/// weekends, networks that differ in fill and eCPM, taps and cancels, interstitials
/// that expire shown and unshown, load errors — written through the same validator,
/// dedupe and storage as `POST /v1/events` and `adtally ingest`.
///
/// Events older than the server's accepted window cannot come over HTTP (by
/// design), so the demo writes them the way `adtally ingest` does, with its own
/// window as long as its history; it does not widen the window of the service.
public struct DemoLoader: Sendable {
    /// A network as one demo app sees it.
    struct Network: Sendable {
        var name: String
        var weight: Double
        /// Share of requests filled.
        var fill: Double
        /// eCPM in USD micros, when the SDK reports revenue per impression.
        var reportedECPMMicros: Int64?
    }

    /// A demo app.
    struct DemoApp: Sendable {
        var id: String
        var name: String
        var timezone: String
        var currency: String
        /// Requests in an average hour.
        var requestsPerHour: Double
        var networks: [Network]
        var countries: [(String, Double)]
        var formats: [(AdFormat, Double)]
    }

    static let apps: [DemoApp] = [
        DemoApp(
            id: "demo-puzzle", name: "Puzzle Garden (demo)", timezone: "Asia/Tokyo", currency: "JPY", requestsPerHour: 210,
            networks: [
                Network(name: "admob", weight: 0.45, fill: 0.93, reportedECPMMicros: 1_900_000),
                Network(name: "applovin", weight: 0.3, fill: 0.86, reportedECPMMicros: nil),
                Network(name: "nend", weight: 0.25, fill: 0.71, reportedECPMMicros: nil),
            ],
            countries: [("JP", 0.7), ("US", 0.1), ("KR", 0.08), ("TW", 0.07), ("ZZ", 0.05)],
            formats: [(.banner, 0.55), (.interstitial, 0.3), (.rewarded, 0.15)]
        ),
        DemoApp(
            id: "demo-news", name: "Daily Brief (demo)", timezone: "America/New_York", currency: "USD", requestsPerHour: 150,
            networks: [
                Network(name: "admob", weight: 0.5, fill: 0.95, reportedECPMMicros: 2_400_000),
                Network(name: "meta", weight: 0.3, fill: 0.78, reportedECPMMicros: nil),
                Network(name: "iad", weight: 0.2, fill: 0.6, reportedECPMMicros: nil),
            ],
            countries: [("US", 0.62), ("CA", 0.12), ("GB", 0.1), ("MX", 0.08), ("IN", 0.08)],
            formats: [(.banner, 0.5), (.native, 0.35), (.interstitial, 0.15)]
        ),
        DemoApp(
            id: "demo-runner", name: "Trail Runner (demo)", timezone: "Europe/Berlin", currency: "EUR", requestsPerHour: 90,
            networks: [
                Network(name: "applovin", weight: 0.4, fill: 0.88, reportedECPMMicros: nil),
                Network(name: "unity", weight: 0.35, fill: 0.74, reportedECPMMicros: nil),
                Network(name: "admob", weight: 0.25, fill: 0.9, reportedECPMMicros: 2_100_000),
            ],
            countries: [("DE", 0.45), ("FR", 0.2), ("GB", 0.15), ("NL", 0.1), ("BR", 0.1)],
            formats: [(.rewarded, 0.5), (.interstitial, 0.3), (.banner, 0.2)]
        ),
    ]

    /// The app ids the demo makes.
    public static var appIDs: [String] { apps.map(\.id) }

    /// The demo's experiment on the switch (DESIGN §14): demo-puzzle's `level_end`
    /// placement, nend against applovin (a dearer card and a better fill) on half the
    /// devices, over the last ten days: a real effect, so the tour shows a result.
    struct DemoExperiment: Sendable {
        static let name = "level-end-applovin"
        var app = "demo-puzzle"
        var placement = "level_end"
        var control = "nend"
        var treatment = "applovin"
        var share = 50
        var salt: String
        var startMicros: Int64

        /// The arm of a device's request, when the experiment covers it.
        func arm(app: String, placement: String, device: String, at: Int64) -> ExperimentArm? {
            guard app == self.app, placement == self.placement, at >= startMicros else { return nil }
            return ExperimentArm.assign(salt: salt, device: device, treatmentShare: share)
        }
    }

    /// How far along the load is.
    public struct Progress: Sendable {
        /// App-days written, of `total`.
        public var done: Int
        /// App-days in all.
        public var total: Int
        /// Events stored so far.
        public var events: Int
    }

    /// What was made.
    public struct Summary: Sendable {
        /// Events stored.
        public var events: Int
        /// Events the validator refused (none, unless the generator is wrong).
        public var rejected: Int
        /// First and last UTC day of the traffic.
        public var firstDay: Int
        /// The last day.
        public var lastDay: Int
        /// A read key for the first app.
        public var readKey: NewKey
        /// An admin key.
        public var adminKey: NewKey
    }

    /// Why the demo did not load.
    public enum DemoError: Error, CustomStringConvertible {
        case alreadyLoaded([String])
        case invalidEvents(Int, String)

        public var description: String {
            switch self {
            case .alreadyLoaded(let apps): "the demo apps exist already (\(apps.joined(separator: ", "))): the demo loads once per database"
            case .invalidEvents(let count, let first): "the demo made \(count) events the validator refused (a bug in the demo), the first: \(first)"
            }
        }
    }

    let database: Database
    /// Days of history, ending now.
    public var days: Int
    /// Traffic multiplier.
    public var scale: Double
    /// Random seed (the same seed makes the same traffic, with fresh event ids).
    public var seed: UInt64
    let logger: Logger

    /// A loader of `days` days of traffic at `scale` times the usual volume.
    public init(database: Database, days: Int = 28, scale: Double = 1, seed: UInt64 = 2026, logger: Logger) {
        self.database = database
        self.days = days
        self.scale = scale
        self.seed = seed
        self.logger = logger
    }

    /// Loads everything; refuses when the demo apps exist.
    public func load(now: Date = Date(), report: (Progress) -> Void = { _ in }) async throws -> Summary {
        let appStore = AppStore(pool: database.pool)
        let existing = try await appStore.listApps().map(\.id).filter { Self.appIDs.contains($0) }
        guard existing.isEmpty else { throw DemoError.alreadyLoaded(existing) }
        let eventStore = EventStore(pool: database.pool, credentialsKey: database.credentialsKey, logger: logger)
        // Ids older than the ledger's pruning cannot be deduplicated: start after it.
        let nowSeconds = Int64(now.timeIntervalSince1970)
        var start = (nowSeconds / 86_400 - Int64(days)) * 86_400
        if let pruned = try await eventStore.widenIDHorizon(to: .zero) { start = max(start, pruned / 1_000_000 / 3600 * 3600 + 7200) }

        for app in Self.apps {
            _ = try await appStore.createApp(id: app.id, name: app.name, timezone: app.timezone, currency: app.currency)
        }
        let firstDay = Int(start / 86_400), lastDay = Int(nowSeconds / 86_400)
        try await loadMoney(firstDay: firstDay, lastDay: lastDay)
        let experiment = try await startExperiment(at: max(start, Int64(lastDay - 9) * 86_400))
        var exposures: [String: (arm: ExperimentArm, at: Int64)] = [:]

        var random = SplitMix64(seed: seed)
        var progress = Progress(done: 0, total: Self.apps.count * (lastDay - firstDay + 1), events: 0)
        var rejected = 0
        var firstRejection: String?
        var sinceCompaction = 0
        let nowMicros = Int64(now.timeIntervalSince1970 * 1_000_000)
        for app in Self.apps {
            // The demo's own window: as long as its history, not the service's.
            let validator = EventValidator(appID: app.id, maxAge: .seconds(nowSeconds - start + 86_400), maxAhead: .seconds(60))
            for day in firstDay...lastDay {
                var events: [AppEvent] = []
                for raw in Self.day(
                    app, day: day, firstDay: firstDay, start: start, end: nowSeconds, scale: scale, random: &random, experiment: experiment, exposures: &exposures
                ) {
                    do {
                        events.append(AppEvent(appID: app.id, event: try validator.validate(raw, nowMicros: nowMicros)))
                    } catch {
                        rejected += 1
                        firstRejection = firstRejection ?? error.description
                    }
                }
                var offset = 0
                while offset < events.count {
                    let slice = Array(events[offset..<min(offset + 10_000, events.count)])
                    progress.events += try await eventStore.store(slice).filter { $0 }.count
                    offset += slice.count
                }
                sinceCompaction += events.count
                if sinceCompaction >= 200_000 {
                    try await RollupCompactor(store: eventStore).compactOnce()
                    sinceCompaction = 0
                }
                progress.done += 1
                report(progress)
            }
        }
        try await RollupCompactor(store: eventStore).compactOnce()
        // Each device's first exposure, as the switch would have recorded it when it first
        // answered the device under the experiment.
        let recorder = ExposureRecorder(pool: database.pool, logger: logger)
        for (index, (device, exposure)) in exposures.sorted(by: { $0.value.at < $1.value.at }).enumerated() {
            recorder.note(app: experiment.app, experiment: DemoExperiment.name, device: device, arm: exposure.arm, at: Date(timeIntervalSince1970: Double(exposure.at) / 1e6))
            // Written as they queue: the queue's bound is far below a large demo's devices.
            if index % 50_000 == 49_999 { try await recorder.flush() }
        }
        try await recorder.flush()
        // A bulk load: the install and cohort grains' statistics now, not at autovacuum's
        // pace (on the fresh tables, a cohort report's plan took seconds where it takes
        // milliseconds; a dashboard right after `adtally demo` reads them).
        _ = try await database.pool.query("ANALYZE installs, install_days, install_day_revenue, cohort_days, cohort_priced_day, experiment_exposures")
        // The generator makes valid events only; a refusal is a bug to see, not to skip.
        if let firstRejection { throw DemoError.invalidEvents(rejected, firstRejection) }
        let readKey = try await appStore.createKey(app: Self.apps[0].id, scope: .read)
        let adminKey = try await appStore.createKey(app: nil, scope: .admin)
        return Summary(events: progress.events, rejected: rejected, firstDay: firstDay, lastDay: lastDay, readKey: readKey, adminKey: adminKey)
    }

    /// Starts the demo's experiment, dated `at` (epoch seconds).
    func startExperiment(at: Int64) async throws -> DemoExperiment {
        let base = DemoExperiment(salt: "", startMicros: at * 1_000_000)
        let scope = MediationScope(app: base.app, placement: base.placement)
        let control = MediationPolicy(scope: scope, rule: .pinned, network: base.control)
        var treatment = control
        treatment.network = base.treatment
        let store = ExperimentStore(pool: database.pool)
        let created = try await store.create(
            Experiment(name: DemoExperiment.name, app: base.app, placement: base.placement, control: control, treatment: treatment, treatmentShare: base.share),
            actor: "adtally demo"
        )
        // Dated to its start, and split by a salt of the demo's seed: the same seed splits
        // the same devices alike (test-citus compares two databases' results).
        let salt = String(format: "00000000-0000-4000-8000-%012llx", seed & 0xFFFF_FFFF_FFFF)
        _ = try await database.pool.query("""
            UPDATE experiments SET started_at = to_timestamp(\(at)::bigint), salt = \(salt)::uuid WHERE app_id = \(base.app) AND name = \(created.name)
            """)
        var experiment = base
        experiment.salt = salt
        return experiment
    }

    /// A rate card in USD (any country, and dearer rates for a few), and EUR-based FX
    /// rates for every day of the traffic.
    func loadMoney(firstDay: Int, lastDay: Int) async throws {
        let money = MoneyStore(pool: database.pool)
        let from = ReportQuery.formatDate(firstDay - 1)
        var entries: [RateCardEntry] = []
        // CPM and CPT in USD micros per network and format: (banner, interstitial, rewarded, native).
        let cards: [(String, [AdFormat: (Int64, Int64)])] = [
            ("applovin", [.banner: (600_000, 40_000), .interstitial: (7_500_000, 120_000), .rewarded: (11_000_000, 150_000), .native: (2_000_000, 60_000)]),
            ("nend", [.banner: (350_000, 25_000), .interstitial: (4_000_000, 80_000), .rewarded: (6_000_000, 90_000), .native: (1_200_000, 40_000)]),
            ("meta", [.banner: (700_000, 50_000), .interstitial: (8_000_000, 150_000), .rewarded: (10_000_000, 150_000), .native: (3_500_000, 90_000)]),
            ("iad", [.banner: (1_000_000, 30_000), .interstitial: (9_000_000, 100_000), .rewarded: (9_000_000, 100_000), .native: (2_500_000, 50_000)]),
            ("unity", [.banner: (400_000, 30_000), .interstitial: (6_500_000, 110_000), .rewarded: (12_500_000, 140_000), .native: (1_500_000, 50_000)]),
            ("admob", [.banner: (800_000, 50_000), .interstitial: (7_000_000, 120_000), .rewarded: (10_000_000, 140_000), .native: (2_500_000, 70_000)]),
        ]
        for (network, formats) in cards {
            for (format, (cpm, cpt)) in formats {
                entries.append(RateCardEntry(network: network, format: format.rawValue, country: "*", currency: "USD", cpmMicros: cpm, cptMicros: cpt, effectiveFrom: from))
                entries.append(RateCardEntry(network: network, format: format.rawValue, country: "US", currency: "USD", cpmMicros: cpm * 3 / 2, cptMicros: cpt * 3 / 2, effectiveFrom: from))
                entries.append(RateCardEntry(network: network, format: format.rawValue, country: "JP", currency: "JPY", cpmMicros: cpm * 150 * 6 / 5, cptMicros: cpt * 150, effectiveFrom: from))
            }
        }
        _ = try await money.setRates(entries)
        // EUR-based rates drifting a little from day to day, as the ECB publishes them.
        var random = SplitMix64(seed: seed &+ 1)
        var levels: [(String, Double)] = [("USD", 1.08), ("JPY", 162.5), ("GBP", 0.85), ("KRW", 1_450), ("CAD", 1.47), ("BRL", 5.9)]
        var rates: [FXRate] = []
        for day in (firstDay - 1)...(lastDay + 1) {
            for index in levels.indices {
                levels[index].1 *= 1 + (random.nextDouble() - 0.5) * 0.008
                let digits = levels[index].1 > 100 ? 2 : 4
                rates.append(FXRate(date: ReportQuery.formatDate(day), base: "EUR", currency: levels[index].0, rate: String(format: "%.\(digits)f", levels[index].1)))
            }
        }
        _ = try await money.importFX(rates)
    }

    /// The devices of an app active on a local day (DESIGN §13's installs): a steady stream
    /// installs, `perDay` a day from a week before the demo's first day on, and a device
    /// comes back on its local day N with probability 0.35 × N^-0.47: 35 % on day 1, 14 %
    /// on day 7 and 7 % on day 30, a casual game's decay. (Each device active on a local
    /// day has a session that day: `day` sees to it.) Deterministic: a hash of the app,
    /// the device and the day decides, so the cohorts are the same in every run that ends on
    /// the same day (`--until`).
    static func activeDevices(_ app: DemoApp, day: Int, firstDay: Int, perDay: Int) -> [Int] {
        var active: [Int] = []
        let origin = firstDay - 7
        guard day >= origin else { return active }
        let salt = UInt64(app.id.utf8.reduce(0) { $0 &* 31 &+ Int($1) }.magnitude)
        for installDay in origin...day {
            let age = day - installDay
            let chance = age == 0 ? 1 : 0.35 * pow(Double(age), -0.47)
            for index in 0..<perDay {
                let device = (installDay - origin) * perDay + index
                var hash = SplitMix64(seed: salt &+ UInt64(device) &* 0x9E37_79B9 &+ UInt64(day) &* 0x85EB_CA6B)
                if age == 0 || hash.nextDouble() < chance { active.append(device) }
            }
        }
        return active
    }

    /// One UTC day of an app's events, in time order within each hour, then a session of
    /// every device active on a local day, at a time of that day in this UTC day (so that a
    /// device the cohorts count as active is seen that day, whatever the ad traffic drew).
    static func day(
        _ app: DemoApp, day: Int, firstDay: Int, start: Int64, end: Int64, scale: Double, random: inout SplitMix64,
        experiment: DemoExperiment? = nil, exposures: inout [String: (arm: ExperimentArm, at: Int64)]
    ) -> [RawEvent] {
        let zone = TimeZone(identifier: app.timezone)!
        var events: [RawEvent] = []
        // About 450 installs a day at scale 1: a local day's actives (new ones and the
        // retained) grow from ~1,000 to ~2,000 over four weeks. Each hour draws from the
        // devices of its local day (the app's zone, where cohorts are counted).
        var actives: [Int: [Int]] = [:]
        for hour in 0..<24 {
            let hourStart = Int64(day) * 86_400 + Int64(hour) * 3600
            guard hourStart >= start, hourStart < end else { continue }
            let localHour = ((hourStart + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(hourStart))))) % 86_400) / 3600
            let weekday = ((hourStart + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(hourStart))))) / 86_400 + 4) % 7
            let localDay = Int((hourStart + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(hourStart))))) / 86_400)
            if actives[localDay] == nil { actives[localDay] = Self.activeDevices(app, day: localDay, firstDay: firstDay, perDay: Int(450 * scale) + 10) }
            let active = actives[localDay]!
            // Quiet at 4 am, busiest around 9 pm local; weekends a fifth busier.
            let phase = Double((localHour + 24 - 4) % 24) / 24
            let rhythm = 0.25 + 1.5 * pow(sin(Double.pi * phase * 0.95), 2)
            let weekend = weekday == 0 || weekday == 6 ? 1.2 : 1
            let requests = Int(app.requestsPerHour * scale * rhythm * weekend * (0.85 + 0.3 * random.nextDouble()))
            for _ in 0..<requests {
                let at = hourStart * 1_000_000 + Int64(random.nextDouble() * 3_600_000_000)
                guard at / 1_000_000 < end else { continue }
                events += request(app, at: at, devices: active, random: &random, experiment: experiment, exposures: &exposures)
                    .filter { $0.1 / 1_000_000 < end }.map(\.0)
            }
            // Sessions: the app coming to the foreground, a few times a day per active device.
            // Drawn from a generator of their own, so the ad traffic is the same as without them.
            var sessionRandom = SplitMix64(seed: UInt64(truncatingIfNeeded: hourStart) &* 31 &+ UInt64(app.id.utf8.count))
            for _ in 0..<(requests / 4) {
                let at = hourStart * 1_000_000 + Int64(sessionRandom.nextDouble() * 3_600_000_000)
                guard at / 1_000_000 < end else { continue }
                events.append(session(app, at: at, device: active[Int(sessionRandom.next() % UInt64(active.count))]))
            }
        }
        // Every active device's own session on each local day this UTC day overlaps.
        let perDay = Int(450 * scale) + 10
        let dayStart = Int64(day) * 86_400
        for localDay in Set([dayStart, dayStart + 86_399].map { Int(($0 + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval($0))))) / 86_400) }).sorted() {
            let offset = Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(Int64(localDay) * 86_400))))
            let devices = actives[localDay] ?? Self.activeDevices(app, day: localDay, firstDay: firstDay, perDay: perDay)
            for device in devices {
                var hash = SplitMix64(seed: UInt64(device) &* 0x2545_F491_4F6C_DD1D &+ UInt64(localDay))
                let at = Int64(localDay) * 86_400 - offset + Int64(hash.next() % 86_400)
                guard at >= dayStart, at < dayStart + 86_400, at >= start, at < end else { continue }
                events.append(session(app, at: at * 1_000_000 + Int64(hash.next() % 1_000_000), device: device))
            }
        }
        return events
    }

    /// A `session` event of a device (DESIGN §2: no network, format or placement).
    static func session(_ app: DemoApp, at: Int64, device: Int) -> RawEvent {
        let isIOS = device % 5 < 3
        var raw = RawEvent()
        raw.set("id", .string(UUID().uuidString.lowercased()))
        raw.set("type", .string(EventType.session.rawValue))
        raw.set("occurred_at", .string(timestamp(at)))
        raw.set("platform", .string(isIOS ? "ios" : "android"))
        raw.set("app_version", .string(["3.2.0", "3.3.0", "3.3.1"][min(2, device % 7 / 2)]))
        raw.set("device", .string("\(app.id)-device-\(device)"))
        return raw
    }

    /// RFC 3339 in UTC: PostgreSQL's "YYYY-MM-DD HH:MM:SS.ffffff+00" with a T and a Z.
    static func timestamp(_ micros: Int64) -> String {
        CivilTime.timestamp(micros: micros).replacingOccurrences(of: " ", with: "T").dropLast(3) + "Z"
    }

    /// One ad request and what followed it: (event, occurred_at micros).
    static func request(
        _ app: DemoApp, at: Int64, devices: [Int], random: inout SplitMix64,
        experiment: DemoExperiment? = nil, exposures: inout [String: (arm: ExperimentArm, at: Int64)]
    ) -> [(RawEvent, Int64)] {
        var network = pick(app.networks.map { ($0, $0.weight) }, &random)
        let format = pick(app.formats, &random)
        let country = pick(app.countries, &random)
        let device = devices[Int(random.next() % UInt64(devices.count))]
        // Under the experiment, the placement shows its arm's network (the switch's answer).
        let placement = format == .banner ? ["home", "feed"][device % 2] : ["level_end", "menu"][device % 2]
        let deviceID = "\(app.id)-device-\(device)"
        if let experiment, let arm = experiment.arm(app: app.id, placement: placement, device: deviceID, at: at),
           let armNetwork = app.networks.first(where: { $0.name == (arm == .treatment ? experiment.treatment : experiment.control) }) {
            network = armNetwork
            if exposures[deviceID] == nil { exposures[deviceID] = (arm, at) }
        }
        let isIOS = device % 5 < 3
        var base = RawEvent()
        base.set("network", .string(network.name))
        base.set("format", .string(format.rawValue))
        base.set("country", .string(country))
        base.set("platform", .string(isIOS ? "ios" : "android"))
        base.set("os_version", .string(isIOS ? ["17.6", "18.1", "18.2"][device % 3] : ["13", "14", "15"][device % 3]))
        base.set("app_version", .string(["3.2.0", "3.3.0", "3.3.1"][min(2, device % 7 / 2)]))
        base.set("placement", .string(placement))
        base.set("device", .string(deviceID))
        if format == .banner { base.set("size", .string("320x50")) }
        var out: [(RawEvent, Int64)] = []
        func event(_ type: EventType, _ micros: Int64, _ extra: (inout RawEvent) -> Void = { _ in }) {
            var raw = base
            raw.set("id", .string(UUID().uuidString.lowercased()))
            raw.set("type", .string(type.rawValue))
            raw.set("occurred_at", .string(timestamp(micros)))
            extra(&raw)
            out.append((raw, micros))
        }
        event(.request, at)
        // Weekend evenings fill a little worse; some countries fill worse everywhere.
        let fill = network.fill * (country == "ZZ" || country == "IN" || country == "BR" ? 0.85 : 1)
        guard random.nextDouble() < fill else {
            let roll = random.nextDouble()
            event(.error, at + 300_000) { $0.set("error_code", .number(roll < 0.8 ? "3" : roll < 0.95 ? "2" : "0")) }
            return out
        }
        let isFullScreen = format == .interstitial || format == .rewarded
        var shownAt: Int64?
        if isFullScreen {
            event(.load, at + 900_000)
            if random.nextDouble() < 0.78 { shownAt = at + Int64(5 + random.nextDouble() * 240) * 1_000_000 }
        } else {
            shownAt = at + 400_000
        }
        guard let shown = shownAt else {
            // Loaded, never shown: the content lapses after half an hour — a wasted fill.
            event(.expiry, at + 1_800_000_000) { $0.set("shown", .bool(false)) }
            return out
        }
        event(.impression, shown) { raw in
            if let ecpm = network.reportedECPMMicros {
                // The SDK reports what this impression earned: eCPM / 1000, give or take.
                raw.set("revenue_micros", .number(String(Int64(Double(ecpm) / 1000 * (0.6 + 0.8 * random.nextDouble())))))
                raw.set("currency", .string("USD"))
                // How the SDK knew it (AdMob's AdValue precision), by device: mostly precise.
                let precision = ["precise", "precise", "precise", "precise", "precise", "precise", "estimated", "estimated", "publisher_provided", nil][device % 10]
                if let precision { raw.set("revenue_precision", .string(precision)) }
            }
        }
        if isFullScreen, random.nextDouble() < 0.25 { event(.expiry, shown + 60_000_000) { $0.set("shown", .bool(true)) } }
        let ctr = format == .banner ? 0.011 : format == .native ? 0.018 : 0.05
        if random.nextDouble() < ctr {
            let leaves = random.nextDouble() < 0.7
            event(.tap, shown + 3_000_000) { $0.set("will_leave", .bool(leaves)) }
            if random.nextDouble() < 0.12 { event(.actionCancel, shown + 5_000_000) }
        }
        return out
    }

    static func pick<T>(_ choices: [(T, Double)], _ random: inout SplitMix64) -> T {
        let total = choices.reduce(0) { $0 + $1.1 }
        var roll = random.nextDouble() * total
        for (value, weight) in choices {
            roll -= weight
            if roll < 0 { return value }
        }
        return choices[choices.count - 1].0
    }
}

import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import Synchronization
import Testing

extension OutboundGate {
    /// For tests whose receivers listen on loopback, as an operator would allow them.
    static let loopbackAllowed = OutboundGate(policy: try! OutboundPolicy(allowing: "127.0.0.0/8, ::1"))
}

/// Where the server's own requests may go (alert webhooks, network pulls): an admin
/// key must not make the server probe its own network or the cloud's metadata address.
@Suite("Outbound requests go only where an operator allows, judged after resolution, to the address judged")
struct OutboundTests {
    @Test("loopback, link-local, private and reserved addresses are refused by default, IPv4 carried in IPv6 too; public ones pass; the allow list lets ranges and hosts through")
    func policy() throws {
        let policy = OutboundPolicy.defaultPolicy
        let refused = [
            ("127.0.0.1", "loopback"), ("169.254.169.254", "link-local"), ("10.1.2.3", "private"), ("172.31.255.1", "private"), ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade"), ("0.0.0.0", "this network"), ("224.0.0.1", "multicast"), ("255.255.255.255", "reserved"),
            ("::1", "loopback"), ("::", "unspecified"), ("fe80::1", "link-local"), ("fd00:ec2::254", "unique local"),
            ("::ffff:169.254.169.254", "link-local"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::a9fe:a9fe", "link-local"), ("::127.0.0.1", "loopback"),
        ]
        for (text, name) in refused {
            let address = try #require(IPAddress(text), "\(text)")
            let refusal = policy.refusal(address, host: text)
            #expect(refusal?.contains(name) == true && refusal?.contains("ADTALLY_OUTBOUND_ALLOW") == true, "\(text): \(refusal ?? "allowed")")
        }
        for text in ["93.184.216.34", "8.8.8.8", "2606:4700::6810:84e5", "::ffff:8.8.8.8", "172.32.0.1", "100.128.0.1"] {
            #expect(policy.refusal(try #require(IPAddress(text)), host: text) == nil, "\(text)")
        }
        // A name is judged by what it resolves to, and the refusal says so.
        #expect(policy.refusal(IPAddress("127.0.0.1")!, host: "hooks.example.com") == "hooks.example.com resolves to 127.0.0.1, which is loopback (127.0.0.0/8): AdTally sends nothing there unless ADTALLY_OUTBOUND_ALLOW lists it")

        let allowing = try OutboundPolicy(allowing: "10.0.0.0/8, fd00::/8 hooks.internal,*.corp.example")
        #expect(allowing.refusal(IPAddress("10.9.9.9")!, host: "a") == nil)
        #expect(allowing.refusal(IPAddress("::ffff:10.9.9.9")!, host: "a") == nil)
        #expect(allowing.refusal(IPAddress("fd12::1")!, host: "a") == nil)
        #expect(allowing.refusal(IPAddress("192.168.0.1")!, host: "HOOKS.internal") == nil)
        #expect(allowing.refusal(IPAddress("192.168.0.1")!, host: "ci.corp.example") == nil)
        #expect(allowing.refusal(IPAddress("192.168.0.1")!, host: "corp.example") != nil)
        #expect(allowing.refusal(IPAddress("192.168.0.1")!, host: "evilcorp.example") != nil)
        #expect(allowing.refusal(IPAddress("169.254.169.254")!, host: "a") != nil)

        #expect(throws: FieldError.self) { try OutboundPolicy(allowing: "10.0.0.0/33") }
        let bad = #expect(throws: SettingsError.self) { try Settings.resolve(flags: .init(), environment: ["ADTALLY_OUTBOUND_ALLOW": "10.0.0.0/8,http://x/"]) }
        #expect(bad?.description.contains("ADTALLY_OUTBOUND_ALLOW") == true && bad?.description.contains("http://x/") == true, "\(bad?.description ?? "")")
        #expect(try Settings.resolve(flags: .init(), environment: [:]).outboundAllow == .defaultPolicy)
    }

    /// A receiver on one loopback address: the requests it got.
    final class Counter: Sendable {
        let hits = Mutex(0)
        var count: Int { hits.withLock { $0 } }
    }

    /// Runs a server on `host` (a loopback address other than localhost's, which
    /// HummingbirdTesting would choose) at `port` (0: any), while `body` runs.
    static func serving<T: Sendable>(_ router: Router<BasicRequestContext>, host: String, port: Int, _ body: @escaping @Sendable (Int) async throws -> T) async throws -> T {
        let bound = AsyncStream<Int>.makeStream()
        let app = Application(router: router, configuration: .init(address: .hostname(host, port: port)), onServerRunning: { channel in
            bound.continuation.yield(channel.localAddress?.port ?? 0)
        })
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                try await app.runService()
                return nil
            }
            var ports = bound.stream.makeAsyncIterator()
            let listening = try #require(await ports.next())
            let result = try await body(listening)
            group.cancelAll()
            return result
        }
    }

    /// Two receivers on one port: 127.0.0.2 (the allowed one) and 127.0.0.1 (refused),
    /// the first answering `firstAnswer`.
    static func withTwoReceivers(
        firstAnswer: @escaping @Sendable (Int) -> Response = { _ in Response(status: .ok) },
        _ body: @escaping @Sendable (_ port: Int, _ allowed: Counter, _ refused: Counter) async throws -> Void
    ) async throws {
        let allowed = Counter()
        let refused = Counter()
        let first = Router()
        first.post("hook") { _, _ in
            allowed.hits.withLock { $0 += 1 }
            return firstAnswer(0)
        }
        try await serving(first, host: "127.0.0.2", port: 0) { port in
            let second = Router()
            second.post("hook") { _, _ in
                refused.hits.withLock { $0 += 1 }
                return Response(status: .ok)
            }
            try await serving(second, host: "127.0.0.1", port: port) { _ in
                try await body(port, allowed, refused)
            }
        }
    }

    @Test("a resolver that answers an allowed address at the check and a refused one after cannot move the request: it goes to the address judged, or nowhere")
    func rebinding() async throws {
        try await Self.withTwoReceivers { port, allowed, refused in
            let asked = Mutex(0)
            // hooks.test: 127.0.0.2 the first time it is asked, 127.0.0.1 ever after.
            let gate = OutboundGate(policy: try OutboundPolicy(allowing: "127.0.0.2")) { host in
                #expect(host == "hooks.test")
                let time = asked.withLock { value in
                    value += 1
                    return value
                }
                return [IPAddress(time == 1 ? "127.0.0.2" : "127.0.0.1")!]
            }
            let client = WebhookClient(gate: gate)
            let request = WebhookRequest(url: "http://hooks.test:\(port)/hook", body: Array("{}".utf8), headers: [("Content-Type", "application/json")])
            #expect(try await client.send(request) == 200)
            #expect(allowed.count == 1 && refused.count == 0 && asked.withLock { $0 } == 1)
            // Asked again, the resolver answers loopback: refused by the rule, nothing sent.
            let error = await #expect(throws: (any Error).self) { try await client.send(request) }
            #expect("\(error.map { "\($0)" } ?? "")" == "webhook: hooks.test resolves to 127.0.0.1, which is loopback (127.0.0.0/8): AdTally sends nothing there unless ADTALLY_OUTBOUND_ALLOW lists it")
            #expect(allowed.count == 1 && refused.count == 0)
            // A rebinding answer that mixes a public address with a refused one is refused whole.
            let mixed = WebhookClient(gate: OutboundGate { _ in [IPAddress("93.184.216.34")!, IPAddress("169.254.169.254")!] })
            let metadata = await #expect(throws: (any Error).self) { try await mixed.send(request) }
            #expect("\(metadata.map { "\($0)" } ?? "")".contains("169.254.169.254, which is link-local"))
            // So is a network pull's endpoint, and the token URI its credential names.
            let pulls = NetworkPullClient(gate: OutboundGate())
            let literal = await #expect(throws: (any Error).self) {
                try await pulls.fetch(NetworkPullRequest(source: .max, endpoint: "http://[::ffff:127.0.0.1]:\(port)/max", credential: "k", from: "2025-01-01", to: "2025-01-02"))
            }
            #expect("\(literal.map { "\($0)" } ?? "")".hasPrefix("endpoint: ::ffff:127.0.0.1 is loopback"), "\(literal.map { "\($0)" } ?? "")")
            let token = await #expect(throws: (any Error).self) {
                try await pulls.fetch(NetworkPullRequest(
                    source: .admob, endpoint: "https://admob.googleapis.com/v1/accounts/pub-1/networkReport:generate",
                    credential: #"{"client_id": "c", "client_secret": "s", "refresh_token": "r", "token_uri": "http://169.254.169.254/token"}"#,
                    from: "2025-01-01", to: "2025-01-02"
                ))
            }
            #expect("\(token.map { "\($0)" } ?? "")".hasPrefix("credential: token_uri: 169.254.169.254 is link-local"), "\(token.map { "\($0)" } ?? "")")
            #expect(allowed.count == 1 && refused.count == 0)
        }
    }

    @Test("a redirect to a refused address is not followed: the 3xx is the answer")
    func redirect() async throws {
        let port = Mutex(0)
        try await Self.withTwoReceivers(firstAnswer: { _ in
            Response(status: .temporaryRedirect, headers: [.location: "http://127.0.0.1:\(port.withLock { $0 })/hook"])
        }) { listening, allowed, refused in
            port.withLock { $0 = listening }
            let client = WebhookClient(gate: OutboundGate(policy: try OutboundPolicy(allowing: "127.0.0.2")))
            let status = try await client.send(WebhookRequest(url: "http://127.0.0.2:\(listening)/hook", body: [], headers: []))
            #expect(status == 307 && allowed.count == 1 && refused.count == 0)
        }
    }

    @Test("POST /v1/alerts/{name}/test to the metadata address answers the refusal, not a receiver's status; so does a loopback webhook")
    func alertTestEndpoint() async throws {
        try await withTestApp { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            _ = try await services.appStore.createApp(id: "probe", name: nil)
            let readable = try await services.reports.readableApps(only: nil)
            for (name, url, rule) in [
                ("metadata", "http://169.254.169.254/latest/meta-data/", "169.254.169.254 is link-local"),
                ("loopback", "http://localhost:5432/", "localhost resolves to"),
            ] {
                let alert = AlertRule(name: name, apps: ["probe"], metric: .fillRate, condition: .below, threshold: 0.5, windowMinutes: 60, webhook: url)
                _ = try await services.alerts.create(alert, secret: nil, readable: readable)
                let (status, text) = try await client.execute(uri: "/v1/alerts/\(name)/test", method: .post, headers: [.authorization: "Bearer \(admin)"]) {
                    ($0.status, String(buffer: $0.body))
                }
                let delivery = try #require((try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["delivery"] as? [String: Any], "\(text)")
                #expect(status == .ok && (delivery["last_status"] == nil || delivery["last_status"] is NSNull), "\(text)")
                let error = delivery["error"] as? String ?? ""
                #expect(error.hasPrefix("webhook: ") && error.contains(rule) && error.contains("ADTALLY_OUTBOUND_ALLOW"), "\(text)")
            }
        }
    }

    @Test("a webhook URL is stored encrypted, answered redacted (scheme, host, last 4) by the API and the history, and URLs stored in plain text before are sealed at start; sending still reaches the whole URL")
    func webhookURLsAreSecrets() async throws {
        try await AlertTests.withReceiver { receiver, url in
            try await withTestApp { services, client in
                let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
                _ = try await services.appStore.createApp(id: "hooked", name: nil)
                let readable = try await services.reports.readableApps(only: nil)
                let secretURL = url + "?token=tokenSECRETxyz9"
                let store = AlertStore(pool: services.database.pool, key: "test-key")
                let rule = AlertRule(name: "sealed", apps: ["hooked"], metric: .fillRate, condition: .below, threshold: 0.5, windowMinutes: 60, webhook: secretURL)
                let created = try await store.create(rule, secret: "0123456789abcdef-secret", readable: readable)
                let shown = "http://127.0.0.1:\(URL(string: url)!.port!)/...xyz9"
                #expect(created.rule.webhook == shown)
                let answer = try await client.execute(uri: "/v1/alerts/sealed", method: .get, headers: [.authorization: "Bearer \(admin)"]) { String(buffer: $0.body) }
                #expect(answer.contains(#""webhook":"\#(shown)""#) || answer.contains(#""webhook" : "\#(shown)""#), "\(answer)")
                #expect(!answer.contains("tokenSECRET"), "\(answer)")
                // A test notification reaches the whole URL; its delivery is shown redacted.
                var alerting = AlertEvaluator.Configuration(identity: "test")
                alerting.send = WebhookClient(gate: .loopbackAllowed).send
                let delivery = try await store.test("sealed", configuration: alerting)
                #expect(delivery.status == "delivered" && delivery.webhook == shown, "\(delivery)")
                #expect(receiver.all.count == 1)
                // Nothing of the URL's token is in any row a dump would hold.
                func plainRows() async throws -> Int {
                    try await services.database.pool.query("""
                        SELECT (SELECT count(*) FROM alert_rules r WHERE r::text LIKE '%tokenSECRET%')
                             + (SELECT count(*) FROM alert_deliveries d WHERE d::text LIKE '%tokenSECRET%')
                        """).first!.decode(0, as: Int.self)
                }
                #expect(try await plainRows() == 0)
                // A rule stored before URLs were sealed (Migrations/0020) is sealed when a server starts.
                try await services.database.pool.query("""
                    UPDATE alert_rules SET webhook_url = \(secretURL), webhook_url_sealed = NULL, webhook_shown = NULL WHERE name = 'sealed'
                    """)
                #expect(try await plainRows() == 1)
                #expect(try await store.rule("sealed").webhook == shown)
                #expect(try await store.sealPlainWebhooks() == 1)
                #expect(try await plainRows() == 0)
                #expect(try await store.test("sealed", configuration: alerting).status == "delivered" && receiver.all.count == 2)
            }
        }
    }
}

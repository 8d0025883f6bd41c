import AdTallyCore
import AdTallyStorage
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

/// `/dashboard` (DESIGN §8): the built-in page of charts for people without
/// Grafana. A read or admin key signs in through a small form (the key goes in a
/// POST body, never a URL) and gets an HttpOnly, SameSite=Strict session cookie
/// signed by the server (`DashboardSessions`); scripts may send
/// `Authorization: Bearer` instead. Every number on the page comes from the report
/// engine; the charts are SVG drawn here, so they need no script, font or CDN.
public struct DashboardRoutes: Sendable {
    let engine: ReportEngine
    let authenticator: KeyAuthenticator
    let sessions: DashboardSessions
    let shares: ReportShares
    let streamLimits: ReportStreamLimits

    /// The longest range the page draws.
    static let maxDays = 366
    /// Ranges up to this many days are drawn by hour.
    static let hourlyDays = 3
    /// The most networks drawn by network.
    static let maxNetworks = 8

    /// Creates the routes; sessions are signed with a secret kept in `store`'s database.
    public init(engine: ReportEngine, authenticator: KeyAuthenticator, store: AppStore, shares: ReportShares, streamLimits: ReportStreamLimits = .init()) {
        self.engine = engine
        self.shares = shares
        self.streamLimits = streamLimits
        self.authenticator = authenticator
        self.sessions = DashboardSessions(store: store)
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("dashboard") { request, context in
            guard let key = try await signedInKey(request) else {
                let next = request.uri.query.flatMap(Self.safeNext)
                return Self.html(DashboardPage.login(message: nil, next: next), status: .ok, headers: Self.clearingCookie(request))
            }
            let place = try shares.enter(keyID: key.id, channel: context.channel)
            defer { withExtendedLifetime(place) {} }
            return try await page(request, key: key)
        }
        router.post("dashboard/login") { request, _ in
            try Self.requireSameOrigin(request)
            let form = try await Self.form(request)
            let secret = (form["key"] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
            guard let key = try await authenticator.authenticate(secret: secret) else {
                return Self.html(DashboardPage.login(message: "That key is unknown or revoked.", next: form["next"].flatMap(Self.safeNext)), status: .unauthorized)
            }
            guard key.scope != .ingest else {
                return Self.html(
                    DashboardPage.login(message: "That is an ingest key (it ships inside apps); sign in with a read or admin key.", next: form["next"].flatMap(Self.safeNext)),
                    status: .forbidden
                )
            }
            let value = try await sessions.make(keyID: key.id)
            var headers = Self.securityHeaders
            // Back to the app and range the link asked for (a query of this page only).
            headers[.location] = "/dashboard" + (form["next"].flatMap(Self.safeNext).map { "?" + $0 } ?? "")
            headers[.setCookie] = Self.cookie(value, maxAge: DashboardSessions.lifetime, request)
            return Response(status: .seeOther, headers: headers)
        }
        router.post("dashboard/logout") { request, _ in
            try Self.requireSameOrigin(request)
            var headers = Self.securityHeaders
            headers[.location] = "/dashboard"
            headers[.setCookie] = Self.cookie("", maxAge: 0, request)
            return Response(status: .seeOther, headers: headers)
        }
        router.get("dashboard/report.csv") { request, context in
            guard let key = try await signedInKey(request) else {
                throw ProblemDetails(.unauthorized, detail: "sign in at /dashboard, or send \"Authorization: Bearer <read key>\"")
            }
            let place = try shares.enter(keyID: key.id, channel: context.channel)
            let selection = try await select(request, key: key)
            if let problem = selection.problem { throw ProblemDetails(.badRequest, detail: problem) }
            let query = try Self.tableQuery(selection, format: .csv)
            var headers = ReportRoutes.csvHeaders(query)
            headers[.cacheControl] = "no-store"
            do {
                return try await ReportRoutes.csvResponse(request, query, engine: engine, holding: place, channel: context.channel, limits: streamLimits, headers: headers)
            } catch let error as ReportCurrencyError {
                throw ProblemDetails(.unprocessableContent, title: "FX rate missing", detail: error.description)
            }
        }
        router.get("dashboard/assets/dashboard.css") { _, _ in
            Self.asset(DashboardPage.styleSheet, type: "text/css; charset=utf-8")
        }
        router.get("dashboard/assets/icon.svg") { _, _ in
            Self.asset(DashboardPage.icon, type: "image/svg+xml")
        }
        router.get("dashboard/assets/dashboard.js") { _, _ in
            Self.asset(DashboardPage.script, type: "text/javascript; charset=utf-8")
        }
    }

    // MARK: - Signing in

    /// The key of a request: its bearer key, else its session cookie's (when signed,
    /// unexpired and the key still live). Ingest keys see nothing here.
    func signedInKey(_ request: Request) async throws -> APIKey? {
        let key: APIKey?
        // Only a Bearer header is a key: a proxy's Basic authentication leaves the cookie in charge.
        if let header = request.headers[.authorization], header.prefix(7).lowercased() == "bearer " {
            key = try await authenticator.authenticate(request)
        } else if let value = request.cookies[DashboardSessions.cookieName]?.value, !value.isEmpty,
                  let id = try await sessions.keyID(from: value) {
            key = try await authenticator.liveKey(id: id)
        } else {
            key = nil
        }
        guard let key else { return nil }
        guard key.scope != .ingest else { throw ProblemDetails(.forbidden, detail: "an ingest key cannot read reports; use a read or admin key") }
        return key
    }

    /// A browser's form posted from another site is refused (login and logout CSRF):
    /// by the browser's `Sec-Fetch-Site` when it sends one, else by `Origin`, which
    /// must be this server as the client reached it (`Host`, or `X-Forwarded-Host`
    /// behind a proxy that rewrites `Host`). An opaque origin (`null`: a sandboxed
    /// frame, a `data:` page) is refused; a client that sends neither header is not a
    /// browser acting for someone else.
    static func requireSameOrigin(_ request: Request) throws {
        if let site = request.headers[HTTPField.Name("Sec-Fetch-Site")!]?.lowercased() {
            guard site == "same-origin" || site == "none" else {
                throw ProblemDetails(.forbidden, detail: "a form from another site (Sec-Fetch-Site: \(site)) cannot sign in or out here")
            }
            return
        }
        guard let origin = request.headers[.origin] else { return }
        guard origin != "null", let url = URL(string: origin), let host = url.host?.trimmingCharacters(in: CharacterSet(charactersIn: "[]")) else {
            throw ProblemDetails(.forbidden, detail: "a form from an opaque or unreadable origin cannot sign in or out here")
        }
        let authority = (host.contains(":") ? "[\(host)]" : host) + (url.port.map { ":\($0)" } ?? "")
        // A chain of proxies lists hosts: the first is the one the browser asked.
        let forwarded = request.headers[HTTPField.Name("X-Forwarded-Host")!]?.split(separator: ",").first.map { $0.trimmingCharacters(in: .whitespaces) }
        let candidates = [request.head.authority, forwarded].compactMap { $0?.lowercased() }
        guard candidates.contains(authority.lowercased()) else {
            throw ProblemDetails(.forbidden, detail: "a form from \(origin) cannot sign in or out here")
        }
    }

    /// A query string to return to after signing in: this page's own parameters
    /// only (letters, digits, `=&%._-`), never a path or another site.
    static func safeNext(_ query: String) -> String? {
        guard !query.isEmpty, query.utf8.count <= 300,
              query.unicodeScalars.allSatisfy({ ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || "=&%._-".unicodeScalars.contains($0) })
        else { return nil }
        return query
    }

    /// A form body (`application/x-www-form-urlencoded`, at most 4 KiB).
    static func form(_ request: Request) async throws -> [String: String] {
        let type = request.headers[.contentType]?.lowercased() ?? ""
        guard type.hasPrefix("application/x-www-form-urlencoded") else {
            throw ProblemDetails(.unsupportedMediaType, detail: "the login form is application/x-www-form-urlencoded")
        }
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: 4096)
        } catch is NIOTooManyBytesError {
            throw ProblemDetails(.contentTooLarge, detail: "the form is larger than 4096 bytes")
        }
        var fields: [String: String] = [:]
        for pair in String(buffer: buffer).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let decode = { (text: Substring) in String(text).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" }
            fields[decode(parts[0])] = parts.count > 1 ? decode(parts[1]) : ""
        }
        return fields
    }

    /// A `Set-Cookie` value: HttpOnly, SameSite=Strict, for /dashboard only; Secure
    /// when the request came over HTTPS (through a proxy that says so).
    static func cookie(_ value: String, maxAge: Int64, _ request: Request) -> String {
        let isSecure = request.head.scheme == "https" || request.headers[HTTPField.Name("X-Forwarded-Proto")!]?.lowercased() == "https"
        return "\(DashboardSessions.cookieName)=\(value); Path=/dashboard; Max-Age=\(maxAge); HttpOnly; SameSite=Strict" + (isSecure ? "; Secure" : "")
    }

    /// Clears a session cookie the request sent (an expired or forged one).
    static func clearingCookie(_ request: Request) -> HTTPFields {
        guard request.cookies[DashboardSessions.cookieName] != nil else { return [:] }
        return [.setCookie: cookie("", maxAge: 0, request)]
    }

    // MARK: - The page

    /// What the request asks to see, checked: the app, the range, the grain.
    struct Selection {
        var apps: [ReportApp]
        var app: ReportApp
        var from: Int
        var to: Int
        var today: Int
        var isAdmin: Bool
        var problem: String?

        var grain: ReportDimension { to - from + 1 <= DashboardRoutes.hourlyDays ? .hour : .date }
    }

    func select(_ request: Request, key: APIKey, apps: [ReportApp]? = nil) async throws -> Selection {
        let apps = if let apps { apps } else { try await engine.readableApps(only: key.app) }
        guard let first = apps.first else { throw ProblemDetails(.notFound, detail: "there is no app to show yet: create one with adtally apps create") }
        let parameters = request.uri.queryParameters
        var problem: String?
        var app = first
        if let id = parameters["app"].map(String.init) {
            if let found = apps.first(where: { $0.id == id }) { app = found } else { problem = "app: no app \"\(id)\" that this key may read" }
        }
        let today = (try? ReportQuery.today(in: app.timezone, now: Date())) ?? 0
        var to = today, from = today - 27
        if let text = parameters["to"].map(String.init), !text.isEmpty {
            if let day = ReportQuery.parseDate(text) { to = day } else { problem = "to: must be a date YYYY-MM-DD" }
        }
        if let text = parameters["from"].map(String.init), !text.isEmpty {
            if let day = ReportQuery.parseDate(text) { from = day } else { problem = "from: must be a date YYYY-MM-DD" }
        } else if parameters["to"] != nil {
            from = to - 27
        }
        if problem == nil, from > to { problem = "from: must not be after to" }
        if problem == nil, to - from + 1 > Self.maxDays { problem = "from: the page draws at most \(Self.maxDays) days; export longer ranges as CSV from /v1/reports" }
        if problem != nil { from = today - 27; to = today }
        return Selection(apps: apps, app: app, from: from, to: to, today: today, isAdmin: key.app == nil, problem: problem)
    }

    /// A report query of the selection, through the same parser as `GET /v1/reports`.
    static func query(
        _ selection: Selection, dimensions: [ReportDimension], metrics: [ReportMetric], filters: [(String, String)] = [], sort: String? = nil,
        limit: Int = ReportQuery.maxLimit, format: ReportFormat = .json
    ) throws -> ReportQuery {
        var parameters = [
            ("apps", selection.app.id), ("from", ReportQuery.formatDate(selection.from)), ("to", ReportQuery.formatDate(selection.to)),
            ("dimensions", dimensions.map(\.rawValue).joined(separator: ",")), ("metrics", metrics.map(\.rawValue).joined(separator: ",")),
        ]
        parameters += filters
        if let sort { parameters.append(("sort", sort)) }
        if format == .json { parameters.append(("limit", String(limit))) }
        do {
            return try ReportQuery.parse(parameters, readable: selection.apps, isAdmin: selection.isAdmin, output: format)
        } catch {
            throw ProblemDetails(.badRequest, detail: error.description)
        }
    }

    /// The table under the charts (and its CSV download): one row per day or hour.
    static func tableQuery(_ selection: Selection, format: ReportFormat = .json) throws -> ReportQuery {
        try query(selection, dimensions: [selection.grain], metrics: DashboardPage.tableMetrics, format: format)
    }

    func page(_ request: Request, key: APIKey) async throws -> Response {
        let apps = try await engine.readableApps(only: key.app)
        guard !apps.isEmpty else { return Self.html(DashboardPage.noApps(key: key), status: .notFound) }
        let selection = try await select(request, key: key, apps: apps)
        do {
            let main = try await engine.page(try Self.tableQuery(selection))
            let expiries = try await engine.page(try Self.query(
                selection, dimensions: [selection.grain], metrics: [.expiries, .wastedFills], filters: [("format", "interstitial")]
            ))
            // Network names come from apps (anyone holding an ingest key can invent them):
            // the charts draw the few that matter, and the page stays small.
            let top = try await engine.page(try Self.query(
                selection, dimensions: [.network], metrics: [.revenue, .requests], sort: "-revenue,-requests", limit: Self.maxNetworks
            ))
            let topNetworks = top.rows.compactMap { $0.dimensions.first ?? nil }
            let networks = try await engine.page(try Self.query(
                selection, dimensions: [selection.grain, .network], metrics: [.revenue, .ecpm],
                filters: topNetworks.isEmpty ? [] : [("network", topNetworks.joined(separator: ","))]
            ))
            // The headline figures against the period before; without them (no FX rate
            // for those earlier days) the page still shows this period's.
            var summary: ReportDocument?
            do {
                summary = try await engine.page(try Self.query(selection, dimensions: [], metrics: DashboardPage.tableMetrics, filters: [("compare", "previous_period")]))
            } catch is ReportCurrencyError {
                summary = nil
            }
            var page = DashboardPage(selection: selection, key: key, main: main, expiries: expiries, networks: networks)
            page.audience = try await engine.page(try Self.query(selection, dimensions: [selection.grain], metrics: DashboardPage.audienceMetrics(selection.grain)))
            page.summary = summary
            page.firstDataDay = try await engine.firstDataDay(of: selection.app)
            // The networks' own reports for the same app and days, when any were imported.
            do {
                let query = try ReconciliationQuery.parse(
                    [("apps", selection.app.id), ("from", ReportQuery.formatDate(selection.from)), ("to", ReportQuery.formatDate(selection.to)),
                     ("dimensions", "date,network")],
                    readable: selection.apps, isAdmin: selection.isAdmin
                )
                page.reconciliation = try await ReconciliationEngine(reports: engine).run(query)
            } catch let error as ReportCurrencyError {
                page.reconciliationFailure = error.description
            } catch let error as ReportQueryError {
                page.reconciliationFailure = error.description
            }
            // The cohorts read days around the range (a week's day 30): a missing FX rate
            // there is said in their section, and the rest of the page still shows.
            do {
                page.cohorts = try await DashboardCohorts.load(engine: engine, selection: selection)
            } catch let error as ReportCurrencyError {
                page.cohortsFailure = error.description
            } catch let error as ReportQueryError {
                page.cohortsFailure = error.description
            }
            // The app's experiments (their own days): a failure is said in their section.
            do {
                page.experiments = try await DashboardExperiments.load(engine: engine, selection: selection)
            } catch {
                page.experimentsFailure = "the experiments could not be listed now (the server's log says why)"
                Logger(label: "adtally.dashboard").warning("experiments not shown", metadata: ["app": "\(selection.app.id)", "error": "\(error)"])
            }
            page.topNetworks = topNetworks.sorted()
            page.hasMoreNetworks = top.nextCursor != nil
            return Self.html(page.html(), status: selection.problem == nil ? .ok : .badRequest)
        } catch let error as ReportCurrencyError {
            let page = DashboardPage(selection: selection, key: key, main: nil, expiries: nil, networks: nil, failure: error.description)
            return Self.html(page.html(), status: .unprocessableContent)
        }
    }

    // MARK: - Responses

    /// No framing, no sniffing, no referrer, and nothing loaded from anywhere but here.
    static let securityHeaders: HTTPFields = [
        .contentSecurityPolicy: "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        HTTPField.Name("X-Content-Type-Options")!: "nosniff",
        HTTPField.Name("Referrer-Policy")!: "no-referrer",
        .cacheControl: "no-store",
    ]

    static func html(_ text: String, status: HTTPResponse.Status, headers extra: HTTPFields = [:]) -> Response {
        var headers = securityHeaders
        headers[.contentType] = "text/html; charset=utf-8"
        headers.append(contentsOf: extra)
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    static func asset(_ text: String, type: String) -> Response {
        var headers = securityHeaders
        headers[.contentType] = type
        headers[.cacheControl] = "public, max-age=300"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}

import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import NIOCore

/// Apps and keys over HTTP: `POST`/`GET /v1/apps`, `POST`/`GET /v1/apps/{app}/keys`,
/// `DELETE /v1/keys/{id}`, `GET`/`PUT /v1/apps/{app}/networks`, `PATCH /v1/apps/{app}`
/// (`retention_days`). Changes need an admin
/// key; a read key may list its own app and its networks.
public struct AdminRoutes: Sendable {
    let store: AppStore
    let authenticator: KeyAuthenticator
    /// Ingest's knowledge of each app's networks, told when a list changes here.
    let networks: AppNetworks

    /// Creates the routes.
    public init(store: AppStore, authenticator: KeyAuthenticator, networks: AppNetworks) {
        self.store = store
        self.authenticator = authenticator
        self.networks = networks
    }

    /// `{"networks": [...]}` or `{"networks": null}`: the key must be there, so a
    /// misspelt body never drops the list by accident.
    struct NetworksBody: Decodable {
        var networks: [String]?

        enum CodingKeys: String, CodingKey { case networks }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            guard container.contains(.networks) else { throw FieldError("networks", "is required: a list of network names, or null to drop the list") }
            networks = try container.decode([String]?.self, forKey: .networks)
        }
    }

    struct CreateApp: Decodable {
        var app: String
        var name: String?
        var timezone: String?
        var currency: String?
    }

    /// `{"retention_days": N}` or `{"retention_days": null}` (the servers' own): the key
    /// must be there, as for the networks.
    struct UpdateApp: Decodable {
        var retentionDays: Int?

        enum CodingKeys: String, CodingKey { case retentionDays = "retention_days" }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            guard container.contains(.retentionDays) else {
                throw FieldError("retention_days", "is required: days of raw events and device rows this app keeps, or null for the servers' own")
            }
            retentionDays = try container.decode(Int?.self, forKey: .retentionDays)
        }
    }

    struct CreateKey: Decodable {
        var scope: String
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.post("v1/apps") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let body: CreateApp = try await Self.decode(request)
            do {
                let app = try await store.createApp(id: body.app, name: body.name, timezone: body.timezone ?? "UTC", currency: body.currency ?? "USD")
                return try Self.json(app, status: .created)
            } catch let error as AppStoreError {
                throw Self.problem(error)
            }
        }
        router.on(.patch, "v1/apps/:app") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            let body: UpdateApp = try await Self.decode(request)
            do {
                return try Self.json(try await store.setRetention(app: app, days: body.retentionDays))
            } catch let error as AppStoreError {
                throw Self.problem(error)
            }
        }
        router.get("v1/apps") { request, _ in
            let key = try await authenticator.require(.read, request)
            let apps = try await store.listApps().filter { key.app == nil || $0.id == key.app }
            return try Self.json(["apps": apps])
        }
        router.post("v1/apps/:app/keys") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            let body: CreateKey = try await Self.decode(request)
            guard let scope = KeyScope(rawValue: body.scope), scope != .admin else {
                throw ProblemDetails(.badRequest, detail: "scope: must be ingest or read")
            }
            do {
                return try Self.json(try await store.createKey(app: app, scope: scope), status: .created)
            } catch let error as AppStoreError {
                throw Self.problem(error)
            }
        }
        router.get("v1/apps/:app/keys") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            guard try await store.app(app) != nil else { throw Self.problem(.unknownApp(app)) }
            return try Self.json(["keys": try await store.listKeys(app: app)])
        }
        router.get("v1/apps/:app/networks") { request, context in
            let key = try await authenticator.require(.read, request)
            let app = try context.parameters.require("app")
            guard key.app == nil || key.app == app else { throw ProblemDetails(.forbidden, detail: "this key may not read app \"\(app)\"") }
            guard let list = try await store.networks(app: app) else { throw Self.problem(.unknownApp(app)) }
            return try Self.json(list)
        }
        router.on(.put, "v1/apps/:app/networks") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            let body: NetworksBody = try await Self.decode(request)
            do {
                let list = try await store.setNetworks(app: app, body.networks)
                networks.forget(app)
                return try Self.json(list)
            } catch let error as AppStoreError {
                throw Self.problem(error)
            }
        }
        router.delete("v1/keys/:id") { request, context in
            _ = try await authenticator.require(.admin, request)
            let id = try context.parameters.require("id")
            do {
                try await store.revokeKey(id)
            } catch let error as AppStoreError {
                throw Self.problem(error)
            }
            authenticator.forget(keyID: id)
            return Response(status: .noContent)
        }
    }

    static func problem(_ error: AppStoreError) -> ProblemDetails {
        switch error {
        case .invalid: ProblemDetails(.badRequest, detail: error.description)
        case .appExists: ProblemDetails(.conflict, detail: error.description)
        case .unknownApp, .unknownKey: ProblemDetails(.notFound, detail: error.description)
        }
    }

    /// Most bytes of an admin request body.
    static let maxBodyBytes = 64 * 1024

    static func decode<T: Decodable>(_ request: Request, upTo limit: Int = maxBodyBytes) async throws -> T {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: limit)
        } catch is NIOTooManyBytesError {
            throw ProblemDetails(.contentTooLarge, detail: "the body is larger than \(limit) bytes")
        }
        do {
            return try JSONDecoder().decode(T.self, from: Data(buffer.readableBytesView))
        } catch let DecodingError.keyNotFound(key, _) {
            throw ProblemDetails(.badRequest, detail: "\(key.stringValue): is required")
        } catch let DecodingError.valueNotFound(_, context) where !context.codingPath.isEmpty {
            throw ProblemDetails(.badRequest, detail: "\(fieldPath(context.codingPath)): is required (not null)")
        } catch let error as FieldError {
            // A value that decoded but breaks a rule (a rate card entry's fields, a mediation
            // policy): not an unreadable body; ProblemMiddleware answers it.
            throw error
        } catch let DecodingError.dataCorrupted(context) where !context.codingPath.isEmpty {
            // A number that does not fit the field (1.5 or 1e20 for a whole number).
            throw ProblemDetails(.badRequest, detail: "\(fieldPath(context.codingPath)): has the wrong type or is out of range")
        } catch let DecodingError.typeMismatch(_, context) {
            throw ProblemDetails(.badRequest, detail: "\(fieldPath(context.codingPath)): has the wrong type")
        } catch {
            throw ProblemDetails(.badRequest, title: "Unreadable body", detail: "the body must be a JSON object")
        }
    }

    /// A decoding path as the API names fields: `devices[3]`, `entries[0].cpm`.
    static func fieldPath(_ path: [any CodingKey]) -> String {
        var text = ""
        for key in path {
            if let index = key.intValue { text += "[\(index)]" } else { text += (text.isEmpty ? "" : ".") + key.stringValue }
        }
        return text
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        let data = try encoder.encode(value)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}

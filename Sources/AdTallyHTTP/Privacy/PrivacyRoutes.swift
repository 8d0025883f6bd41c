import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import NIOCore

/// Privacy over HTTP (DESIGN §15), every route but the kit's with an admin key:
///
/// - `DELETE /v1/apps/{app}/devices/{device}` and `POST /v1/apps/{app}/devices/erase`
///   (`{"devices": [...]}`, at most 1,000): queue an erasure, `202` with the job;
/// - `GET /v1/erasures/{id}`: the job (`queued`, `running`, `done`, `failed`, and the rows
///   removed per table); `GET /v1/apps/{app}/erasures`: the app's erasure log;
/// - `GET /v1/apps/{app}/devices/{device}`: the device's data as NDJSON (access);
/// - `DELETE /v1/devices/{device}` with the app's ingest key: the kit's `forgetInstall()`,
///   for an id the app has sent (`404` otherwise: nothing to erase).
///
/// A device id in a path is percent-decoded once (an id may hold `/` or spaces).
public struct PrivacyRoutes: Sendable {
    let store: ErasureStore
    let access: DeviceAccess
    let authenticator: KeyAuthenticator
    /// The servers' `--retention-days` (the access stream's `end` line says which retention holds).
    let retentionDays: Int

    /// Creates the routes.
    public init(store: ErasureStore, access: DeviceAccess, authenticator: KeyAuthenticator, retentionDays: Int) {
        self.store = store
        self.access = access
        self.authenticator = authenticator
        self.retentionDays = retentionDays
    }

    struct EraseBody: Decodable {
        var devices: [String]
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.delete("v1/apps/:app/devices/:device") { request, context in
            let key = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            let device = try Self.device(context)
            return try await Self.queued { try await store.queue(app: app, devices: [device], requestedBy: key.id) }
        }
        router.post("v1/apps/:app/devices/erase") { request, context in
            let key = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            // 1,000 ids of up to 64 characters (256 bytes of UTF-8 each) in JSON.
            let body: EraseBody = try await AdminRoutes.decode(request, upTo: 1 << 20)
            return try await Self.queued { try await store.queue(app: app, devices: body.devices, requestedBy: key.id) }
        }
        router.get("v1/erasures/:id") { request, context in
            _ = try await authenticator.require(.admin, request)
            let text = try context.parameters.require("id")
            guard let id = UUID(uuidString: text) else { throw ProblemDetails(.badRequest, detail: "id: must be an erasure's id (a UUID)") }
            guard let erasure = try await store.get(id) else { throw ProblemDetails(.notFound, detail: "no erasure \"\(text)\"") }
            return try AdminRoutes.json(erasure)
        }
        router.get("v1/apps/:app/erasures") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            return try AdminRoutes.json(["erasures": try await store.list(app: app)])
        }
        router.get("v1/apps/:app/devices/:device") { request, context in
            _ = try await authenticator.require(.admin, request)
            let app = try context.parameters.require("app")
            let device = try Self.device(context)
            do {
                try await access.check(app: app, device: device)
            } catch let refusal as DeviceAccess.Refusal {
                switch refusal {
                case .invalid: throw ProblemDetails(.badRequest, detail: refusal.description)
                case .unknownApp: throw ProblemDetails(.notFound, detail: refusal.description)
                }
            }
            let headers: HTTPFields = [.contentType: "application/x-ndjson", .cacheControl: "no-store"]
            if request.method == .head { return Response(status: .ok, headers: headers) }
            let access = self.access, retentionDays = self.retentionDays
            return Response(status: .ok, headers: headers, body: ResponseBody { writer in
                try await access.stream(app: app, device: device, retentionDays: retentionDays) { bytes in
                    try await writer.write(ByteBuffer(bytes: bytes))
                }
                try await writer.finish(nil)
            })
        }
        router.delete("v1/devices/:device") { request, context in
            let key = try await authenticator.require(.ingest, request)
            guard let app = key.app else { throw ProblemDetails(.forbidden, detail: "an ingest key must belong to an app") }
            let device = try Self.device(context)
            return try await Self.queued { try await store.queueFromKit(app: app, device: device) }
        }
    }

    /// The `{device}` of the path, percent-decoded.
    static func device(_ context: AdTallyRequestContext) throws -> String {
        let raw = try context.parameters.require("device")
        guard let device = raw.removingPercentEncoding, DeviceErasure.isDevice(device) else {
            throw ProblemDetails(.badRequest, detail: "device: \(DeviceErasure.deviceRule), percent-encoded in the path")
        }
        return device
    }

    /// `202` with the job and where to poll it, or the refusal as a problem.
    static func queued(_ queue: () async throws -> Erasure) async throws -> Response {
        let erasure: Erasure
        do {
            erasure = try await queue()
        } catch let error as ErasureError {
            switch error {
            case .invalid: throw ProblemDetails(.badRequest, detail: error.description)
            case .unknownApp, .unknownDevice: throw ProblemDetails(.notFound, detail: error.description)
            }
        }
        var response = try AdminRoutes.json(erasure, status: .accepted)
        response.headers[.location] = "/v1/erasures/\(erasure.id.uuidString.lowercased())"
        return response
    }
}

import AdTallyApp
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import NIOCore
import Testing

@Suite("/openapi.yaml")
struct OpenAPITests {
    @Test("real responses of every endpoint match the served OpenAPI document (openapi-core validates them)")
    func responsesMatchTheDocument() async throws {
        try await withMigratedDatabase { conninfo in
            let (database, _) = try await openWithApp(conninfo, app: "seed")
            let admin = try await AppStore(pool: database.pool).createKey(app: nil, scope: .admin).secret
            await database.close()
            try await withReadyServer(conninfo) { server, _ in
                let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                    .deletingLastPathComponent().appendingPathComponent("scripts/openapi_check.py")
                let (status, text) = try await runProcess(["python3", script.path, "http://127.0.0.1:\(server.port)", admin])
                #expect(status == 0, "\(text)")
                #expect(text.contains("self-check: the validator rejects"), "\(text)")
                #expect(text.contains("checked GET /v1/reports -> 200"), "\(text)")
                // The file is the document: served byte for byte, and valid OpenAPI 3.1 to an
                // independent validator, which must also be able to refuse a broken copy.
                let file = DashboardTests.repository.appendingPathComponent("Sources/AdTallyHTTP/Resources/openapi.yaml")
                let body = try await withHTTPClient { client in
                    let served = try await client.execute(HTTPClientRequest(url: "http://127.0.0.1:\(server.port)/openapi.yaml"), timeout: .seconds(10))
                    return try await served.body.collect(upTo: 1 << 22)
                }
                #expect(Data(buffer: body) == (try Data(contentsOf: file)), "/openapi.yaml is not the file byte for byte")
                let (valid, validation) = try await runProcess(["python3", "-m", "openapi_spec_validator", file.path])
                #expect(valid == 0, "openapi-spec-validator: \(validation)")
                let broken = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-openapi-\(UUID().uuidString).yaml")
                defer { try? FileManager.default.removeItem(at: broken) }
                try (try String(contentsOf: file, encoding: .utf8)).replacingOccurrences(of: "\n        \"200\":", with: "\n        200x:", options: [], range: nil)
                    .write(to: broken, atomically: true, encoding: .utf8)
                let (refused, _) = try await runProcess(["python3", "-m", "openapi_spec_validator", broken.path])
                #expect(refused != 0, "openapi-spec-validator accepted a document with a malformed response code")
            }
        }
    }
}

import Hummingbird
import NIOCore

/// The OpenAPI 3.1 description of every endpoint: `Resources/openapi.yaml`, embedded
/// in the binary at build time and served at `/openapi.yaml` byte for byte.
/// `OpenAPITests` validates the file (openapi-spec-validator) and checks real responses
/// of each endpoint against it; schemathesis fuzzes the API against it.
///
/// The routes and their types stay hand-written and checked against the document,
/// not generated from it (swift-openapi-generator): the document describes streaming
/// CSV and NDJSON, problem+json on every path and the dashboard's HTML, which the
/// generated server would need hand-written escapes for, and the handlers are thin
/// over the stores; the checks above fail on any drift between the two.
public enum OpenAPIDocument {
    /// Adds `GET /openapi.yaml`.
    public static func register(on router: Routes) {
        router.get("openapi.yaml") { _, _ in
            Response(status: .ok, headers: [.contentType: "application/yaml"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
        }
    }

    /// The file's bytes.
    public static let bytes: [UInt8] = PackageResources.openapi_yaml

    /// The document.
    public static let yaml = String(decoding: bytes, as: UTF8.self)
}

import Hummingbird
import NIOCore

/// The per-request context of AdTally's routes.
public struct AdTallyRequestContext: RequestContext {
    /// Hummingbird's per-request storage.
    public var coreContext: CoreRequestContextStorage
    /// The connection, so a route can close it (a body that never finishes arriving).
    public let channel: any Channel

    /// Creates the context for one request.
    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.channel = source.channel
    }
}

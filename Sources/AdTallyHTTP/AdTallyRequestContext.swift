import Hummingbird

/// The per-request context of AdTally's routes.
public struct AdTallyRequestContext: RequestContext {
    /// Hummingbird's per-request storage.
    public var coreContext: CoreRequestContextStorage

    /// Creates the context for one request.
    public init(source: Source) {
        self.coreContext = .init(source: source)
    }
}

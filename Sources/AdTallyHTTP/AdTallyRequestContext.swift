import Hummingbird

/// The per-request context of AdTally's routes.
public struct AdTallyRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage

    public init(source: Source) {
        self.coreContext = .init(source: source)
    }
}

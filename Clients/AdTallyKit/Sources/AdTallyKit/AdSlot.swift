import Foundation

/// One ad slot's life (DESIGN §1), told the way the ad SDK's delegate tells it:
/// call each method from the matching callback (`adViewDidReceiveAd` → `shown`,
/// `interstitialDidReceiveAd` → `loaded`, `didFailToReceiveAdWithError` → `failed`,
/// `paidEventHandler` → the revenue of `shown`, `actionShouldBegin` → `tapped`, an
/// action the app ends early → `actionCancelled`, an interstitial unloaded → `expired`).
///
/// Every method writes the event to the on-disk queue before it returns, and returns
/// its id. A call out of order (a tap on an ad never shown, a second impression for one
/// load) is a programming error: it throws `AdTallyError.misuse` and records nothing.
public final class AdSlot: @unchecked Sendable {
    /// Where the slot is in its life.
    public enum State: String, Sendable {
        /// No request yet, or the last ad's life is over (failed or expired).
        case idle
        /// An ad was asked for; no answer yet.
        case requested
        /// An ad arrived and is held, not yet shown (interstitials, rewarded, native).
        case loaded
        /// The ad is on screen.
        case shown
        /// The user tapped it and its action (a page, the store) is in progress.
        case acting
    }

    public let network: String
    public let format: AdFormat
    public let placement: String?
    public let size: String?
    /// The instance the slot came from, kept alive while the slot lives.
    private let owner: AdTally
    private var engine: Engine { owner.engine }
    private let lock = NSLock()
    private var _state = State.idle

    init(owner: AdTally, network: String, format: AdFormat, placement: String?, size: String?) {
        self.owner = owner
        self.network = network
        self.format = format
        self.placement = placement
        self.size = size
    }

    /// The slot's state now.
    public var state: State { lock.lock(); defer { lock.unlock() }; return _state }

    /// The app asked the network for an ad (`request`): the slot's inventory.
    @discardableResult
    public func requested() throws -> UUID {
        try step("requested()", from: [.idle, .shown, .acting], to: .requested, type: "request") { _ in }
    }

    /// The ad arrived and is held for later (`load`).
    @discardableResult
    public func loaded() throws -> UUID {
        try step("loaded()", from: [.requested], to: .loaded, type: "load") { _ in }
    }

    /// The network had no ad or failed (`error`, with its error code).
    @discardableResult
    public func failed(code: Int) throws -> UUID {
        try checked { guard Int32(exactly: code) != nil else { throw AdTallyError.misuse("failed(code:): \(code) is not a 32-bit integer") } }
        return try step("failed(code:)", from: [.requested], to: .idle, type: "error") { $0.add("error_code", Int64(code)) }
    }

    /// The ad is on screen (`impression`), with the revenue the network SDK reported for
    /// it when it did (AdMob's `paidEventHandler`: `value` in micros, `currencyCode`, `precision`).
    @discardableResult
    public func shown(revenueMicros: Int64? = nil, currency: String? = nil, precision: RevenuePrecision? = nil) throws -> UUID {
        try checked { try Self.checkRevenue(revenueMicros, currency, precision, "shown") }
        return try step("shown()", from: [.requested, .loaded], to: .shown, type: "impression") { json in
            json.add("revenue_micros", revenueMicros)
            json.add("currency", currency)
            json.add("revenue_precision", precision?.rawValue)
        }
    }

    /// The user tapped the ad (`tap`); `willLeave`: its action sends the user out of the app.
    @discardableResult
    public func tapped(willLeave: Bool = false, revenueMicros: Int64? = nil, currency: String? = nil, precision: RevenuePrecision? = nil) throws -> UUID {
        try checked { try Self.checkRevenue(revenueMicros, currency, precision, "tapped") }
        return try step("tapped()", from: [.shown, .acting], to: .acting, type: "tap") { json in
            json.add("will_leave", willLeave)
            json.add("revenue_micros", revenueMicros)
            json.add("currency", currency)
            json.add("revenue_precision", precision?.rawValue)
        }
    }

    /// The app cancelled the ad action in progress to take the user back (`action_cancel`).
    @discardableResult
    public func actionCancelled() throws -> UUID {
        try step("actionCancelled()", from: [.acting], to: .shown, type: "action_cancel") { _ in }
    }

    /// The ad's content lapsed and it unloaded (`expiry`); whether it had been shown is
    /// known by the slot (an interstitial that expires unshown is a wasted fill).
    @discardableResult
    public func expired() throws -> UUID {
        try step("expired()", from: [.loaded, .shown, .acting], to: .idle, type: "expiry") { json, state in
            json.add("shown", state == .shown || state == .acting)
        }
    }

    private func step(_ call: String, from allowed: Set<State>, to next: State, type: String, fields: (inout EventJSON) -> Void) throws -> UUID {
        try step(call, from: allowed, to: next, type: type) { json, _ in fields(&json) }
    }

    /// Records the event of `call` if the slot's state allows it, and moves the slot on;
    /// `fields` sees the state the call found, under the slot's lock.
    private func step(_ call: String, from allowed: Set<State>, to next: State, type: String, fields: (inout EventJSON, State) -> Void) throws -> UUID {
        lock.lock()
        guard allowed.contains(_state) else {
            let error = AdTallyError.misuse("\(call) on \(network)/\(format.rawValue)\(placement.map { "/" + $0 } ?? ""): \(Self.why(call, _state))")
            lock.unlock()
            // The app's handler runs outside the slot's lock: it may look at the slot.
            engine.reportMisuse(error)
            throw error
        }
        defer { lock.unlock() }
        let state = _state
        let id = try engine.record(type: type, network: network, format: format, placement: placement, size: size) { fields(&$0, state) }
        _state = next
        return id
    }

    /// Runs a value check; a misuse it throws is reported to the app's handler first.
    private func checked(_ check: () throws -> Void) throws {
        do {
            try check()
        } catch let error as AdTallyError {
            engine.reportMisuse(error)
            throw error
        }
    }

    private static func why(_ call: String, _ state: State) -> String {
        switch (call, state) {
        case ("shown()", .shown), ("shown()", .acting): "a second impression for one load (call requested() for the next ad)"
        case ("tapped()", _): "a tap on an ad never shown (the slot is \(state.rawValue))"
        case ("actionCancelled()", _): "no ad action in progress to cancel (tapped() first; the slot is \(state.rawValue))"
        case ("requested()", _): "the previous request has no outcome yet (loaded, failed or shown; the slot is \(state.rawValue))"
        case ("expired()", _): "no ad is held to expire (the slot is \(state.rawValue))"
        default: "not allowed when the slot is \(state.rawValue)"
        }
    }

    private static func checkRevenue(_ micros: Int64?, _ currency: String?, _ precision: RevenuePrecision?, _ call: String) throws {
        switch (micros, currency) {
        case (nil, nil):
            if precision != nil { throw AdTallyError.misuse("\(call)(): precision is given without revenueMicros") }
        case (.some(let value), .some(let code)):
            guard value >= 0, value <= 1_000_000_000_000_000 else { throw AdTallyError.misuse("\(call)(): revenueMicros must be from 0 to 10^15") }
            try EventRules.checkCurrency(code)
        default:
            throw AdTallyError.misuse("\(call)(): revenueMicros and currency go together")
        }
    }
}

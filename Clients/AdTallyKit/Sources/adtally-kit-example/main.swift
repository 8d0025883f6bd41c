import AdTallyKit
import KitCommandLine
import Foundation

// The kit's example: a session, a banner's and an interstitial's life sent to a
// server (`make run`'s, by default), then the switch's answer.
//
//   swift run --package-path Clients/AdTallyKit adtally-kit-example --key KEY [--server http://127.0.0.1:8080]

guard let key = option("--key") ?? ProcessInfo.processInfo.environment["ADTALLY_KEY"] else {
    print("usage: adtally-kit-example --key INGEST_KEY [--server URL] [--dir FOLDER]")
    print("(an ingest key: adtally keys create --app APP --scope ingest)")
    exit(2)
}
let server = URL(string: option("--server") ?? "http://127.0.0.1:8080")!
let folder = URL(fileURLWithPath: option("--dir") ?? FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-example").path)

var configuration = AdTallyConfiguration()
configuration.appVersion = "1.0.0"
configuration.defaultNetwork = "admob"
configuration.notices = { notice in print("notice: \(notice)") }
let tally = try AdTally(server: server, appKey: key, directory: folder, configuration: configuration)

try tally.sessionStarted()

// A banner, in the order GADBannerViewDelegate tells it.
let banner = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50")
try banner.requested()                                                       // bannerView.load(request)
try banner.shown(revenueMicros: 1_250, currency: "USD", precision: .precise) // bannerViewDidReceiveAd + paidEventHandler
try banner.tapped(willLeave: false)                                          // bannerViewWillPresentScreen
try banner.actionCancelled()                                                 // the app took the screen back

// An interstitial loaded, never shown, expired: a wasted fill.
let interstitial = try tally.slot(network: "iad", format: .interstitial, placement: "level_end")
try interstitial.requested()
try interstitial.loaded()                                                    // interstitialAdDidLoad
try interstitial.expired()                                                   // interstitialAdDidUnload

waitFor {
    try await tally.flush()
    let status = tally.status
    print("sent: \(status.delivered) events delivered, \(status.pending) pending, \(status.deadLettered) refused")
    let network = await tally.refreshNetwork(for: "home")
    print("the switch says: show \(network ?? "nothing") on home")
}

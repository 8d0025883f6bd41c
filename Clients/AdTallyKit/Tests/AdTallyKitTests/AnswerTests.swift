@_spi(Answers) @testable import AdTallyKit
import Foundation
import XCTest

/// What the kit believes of an answer (DESIGN §10: only AdTally's own answer counts).
/// The same rules against a real server and a hostile middlebox are tested in the
/// server's suite (Tests/AdTallyTests/KitHostileNetworkTests.swift).
final class AnswerTests: XCTestCase {
    func receipt(_ text: String, count: Int, type: String = "application/json") -> Result<Receipt, AnswerRefusal> {
        Receipt.parse(Data(text.utf8), mediaType: type, count: count)
    }

    func testAReceiptIsBelievedOnlyWhenItAnswersTheWholeBatch() throws {
        let good = try receipt(#"{"accepted":7,"duplicates":2,"rejected":[{"index":4,"id":"x","error":"occurred_at: too old"}]}"#, count: 10).get()
        XCTAssertEqual(good.rejected, [Receipt.Rejection(index: 4, reason: "occurred_at: too old")])
        let refusals = [
            (#"{"accepted":9,"duplicates":0,"rejected":[{"index":-1,"error":"boom"}]}"#, "index -1"),
            (#"{"accepted":8,"duplicates":0,"rejected":[{"index":0},{"index":0}]}"#, "index 0 twice"),
            (#"{"accepted":9,"duplicates":0,"rejected":[{"index":10}]}"#, "index 10"),
            (#"{"accepted": 1}"#, "not AdTally's receipt"),
            (#"{"accepted":1,"duplicates":0,"rejected":[]}"#, "a receipt for 1 events"),
            (#"{"accepted":9223372036854775807,"duplicates":9223372036854775807,"rejected":[]}"#, "outside the batch"),
            (#"{"accepted":1e400,"duplicates":0,"rejected":[]}"#, "not AdTally's receipt"),
            (#"{"accepted":true,"duplicates":0,"rejected":[]}"#, "not AdTally's receipt"),
            (#"[1,2,3]"#, "not AdTally's receipt"),
        ]
        for (text, reason) in refusals {
            guard case .failure(let refusal) = receipt(text, count: 10) else { return XCTFail("believed: \(text)") }
            XCTAssertTrue(refusal.description.contains(reason), "\(text): \(refusal)")
        }
        guard case .failure(let html) = receipt(#"{"accepted":10,"duplicates":0,"rejected":[]}"#, count: 10, type: "text/html") else { return XCTFail() }
        XCTAssertTrue(html.description.contains("not JSON"))
    }

    func testErasedEventsAreDeliveredAndCountedAmongTheDuplicates() throws {
        // An erased device's old events (DESIGN §15): among the duplicates, so that a kit
        // that predates erasure still finds the counts adding up; this one reads the list.
        let good = try receipt(#"{"accepted":8,"duplicates":2,"rejected":[],"erased":[{"index":3,"id":"x"},{"index":5,"id":"y"}]}"#, count: 10).get()
        XCTAssertEqual(good.erased, [3, 5])
        XCTAssertEqual(try receipt(#"{"accepted":10,"duplicates":0,"rejected":[]}"#, count: 10).get().erased, [])
        let refusals = [
            #"{"accepted":9,"duplicates":1,"rejected":[],"erased":[{"index":3},{"index":5}]}"#,
            #"{"accepted":8,"duplicates":2,"rejected":[],"erased":[{"index":3},{"index":3}]}"#,
            #"{"accepted":8,"duplicates":2,"rejected":[],"erased":[{"index":10}]}"#,
            #"{"accepted":8,"duplicates":1,"rejected":[{"index":3,"error":"e"}],"erased":[{"index":3}]}"#,
        ]
        for text in refusals {
            guard case .failure(let refusal) = receipt(text, count: 10) else { return XCTFail("believed: \(text)") }
            XCTAssertTrue(refusal.description.contains("erased events"), "\(text): \(refusal)")
        }
    }

    func testAReasonIsBoundedAndFreeOfControlCharacters() throws {
        let long = String(repeating: "é", count: 5000)
        let receipt = try receipt(#"{"accepted":0,"duplicates":0,"rejected":[{"index":0,"error":"\#(long)\n"}]}"#, count: 1).get()
        XCTAssertLessThanOrEqual(receipt.rejected[0].reason.utf8.count, 1024)
        let control = try self.receipt(#"{"accepted":0,"duplicates":0,"rejected":[{"index":0,"error":"a\nb\u0000c"}]}"#, count: 1).get()
        XCTAssertEqual(control.rejected[0].reason, "a b c")
    }

    func answer(_ status: Int, _ type: String?, _ body: String, _ headers: [String: String] = [:]) -> WireAnswer {
        var all = headers
        if let type { all["content-type"] = type }
        return WireAnswer(status: status, headers: all, body: Data(body.utf8))
    }

    func testAnErasureRequestEndsOnlyOnAdTallysOwnAnswer() {
        func ends(_ answer: WireAnswer?) -> Bool {
            if case .answered = Engine.judgeForget(answer) { return true }
            return false
        }
        XCTAssertTrue(ends(answer(202, "application/json", #"{"id":"e1","status":"queued","app":"a"}"#)))
        XCTAssertTrue(ends(answer(404, "application/problem+json", #"{"type":"about:blank","title":"Not Found","status":404,"detail":"device: no event of this app ever named it (nothing to erase)"}"#)))
        // A server without the route, a captive portal, a proxy's 202, a refused key: tried again later.
        XCTAssertFalse(ends(answer(404, "application/problem+json", #"{"type":"about:blank","title":"Not Found","status":404,"detail":"no route for DELETE /v1/devices/x"}"#)))
        XCTAssertFalse(ends(answer(202, "text/html", "<html>welcome</html>")))
        XCTAssertFalse(ends(answer(202, "application/json", "{}")))
        XCTAssertFalse(ends(answer(401, "application/problem+json", #"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"unknown key"}"#)))
        XCTAssertFalse(ends(nil))
        guard case .retryAfter(let seconds) = Engine.judgeForget(answer(503, "application/problem+json", "{}", ["retry-after": "7"])) else { return XCTFail() }
        XCTAssertEqual(seconds, 7)
    }

    func testOnlyAdTallysOwnRefusalsAreFinal() {
        let server = URL(string: "https://adtally.example.com")!
        let problem = #"{"type":"about:blank","title":"Content Too Large","status":413,"detail":"more than 1000 events"}"#
        XCTAssertEqual(BatchOutcome.judge(answer(413, "application/problem+json", problem), count: 5, server: server), .split("413: more than 1000 events", byAdTally: true))
        guard case .split(_, byAdTally: false) = BatchOutcome.judge(answer(413, "text/html", "<html>nginx</html>", ["server": "nginx"]), count: 5, server: server) else {
            return XCTFail("a proxy's 413")
        }
        guard case .notAdTally(400, _) = BatchOutcome.judge(answer(400, "text/html", "<html>"), count: 5, server: server) else { return XCTFail("a proxy's 400") }
        guard case .notAdTally(403, _) = BatchOutcome.judge(answer(403, "text/html", "blocked by policy"), count: 5, server: server) else {
            return XCTFail("a proxy's 403 must not stop sending")
        }
        let refused = #"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"unknown key"}"#
        XCTAssertEqual(BatchOutcome.judge(answer(401, "application/problem+json", refused), count: 5, server: server), .stopped(401, "unknown key"))
        guard case .notAdTally(307, let detail) = BatchOutcome.judge(
            answer(307, nil, "", ["location": "https://tally.example.com/api/v1/events"]), count: 5, server: server
        ) else { return XCTFail("a redirect") }
        XCTAssertTrue(detail.contains("configure the server as https://tally.example.com/api"), detail)
        guard case .notAdTally(200, let portal) = BatchOutcome.judge(answer(200, "text/html", "<html>Sign in</html>", ["server": "portal"]), count: 5, server: server) else {
            return XCTFail("a portal's 200")
        }
        XCTAssertTrue(portal.contains("text/html") && portal.contains("portal"), portal)
    }

    func testASwitchAnswerMustNameANetworkTheServerCouldSend() {
        func parse(_ text: String, _ type: String = "application/json") -> String? {
            try? SwitchAnswer.parse(Data(text.utf8), mediaType: type).get()
        }
        XCTAssertEqual(parse(#"{"enable_advertising":"admob","rule":"pinned"}"#), "admob")
        for bad in [#"{"enable_advertising":""}"#, #"{"enable_advertising":"ad\u0001mob"}"#, #"{"enable_advertising":"AdMob"}"#,
                    #"{"enable_advertising":"\#(String(repeating: "a", count: 33))"}"#, #"{"enable_advertising":null}"#, #"{}"#, "<html>"] {
            XCTAssertNil(parse(bad), bad)
        }
        XCTAssertNil(parse(#"{"enable_advertising":"admob"}"#, "text/html"))
    }

    func testMaxAgeAndRetryAfterAreBounded() {
        XCTAssertEqual(Switchboard.maxAge("public, max-age=30"), 30)
        XCTAssertNil(Switchboard.maxAge("max-age=inf"))
        XCTAssertNil(Switchboard.maxAge("max-age=-1"))
        XCTAssertEqual(BatchOutcome.retryAfter("99999999"), 3600)
        XCTAssertNil(BatchOutcome.retryAfter("nan"))
    }
}

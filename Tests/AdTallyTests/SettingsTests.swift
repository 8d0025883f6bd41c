import AdTallyApp
import AdTallyCore
import AdTallyHTTP
import Testing

@Suite("Configuration precedence")
struct SettingsTests {
    @Test("a flag beats the environment, which beats the default")
    func precedence() throws {
        let environment = ["ADTALLY_PORT": "9000", "ADTALLY_HOST": "0.0.0.0", "DATABASE_URL": "postgresql://env/db"]
        let fromEnvironment = try Settings.resolve(flags: .init(), environment: environment)
        #expect(fromEnvironment.port == 9000)
        #expect(fromEnvironment.host == "0.0.0.0")
        #expect(fromEnvironment.databaseURL == "postgresql://env/db")
        let fromFlags = try Settings.resolve(flags: .init(databaseURL: "postgresql://flag/db", port: 7000), environment: environment)
        #expect(fromFlags.port == 7000)
        #expect(fromFlags.databaseURL == "postgresql://flag/db")
        let defaults = try Settings.resolve(flags: .init(), environment: [:])
        #expect(defaults.port == 8080)
        #expect(defaults.host == "127.0.0.1")
        #expect(defaults.databaseURL == nil)
        #expect(defaults.dataDirectory == ".adtally")
    }

    @Test("the accepted event window defaults to 7 days back and 60 minutes ahead, and must end inside retention")
    func eventWindow() throws {
        let defaults = try Settings.resolve(flags: .init(), environment: [:])
        #expect(defaults.maxEventAge == .seconds(7 * 86_400))
        #expect(defaults.maxEventAhead == .seconds(3600))
        let wide = try Settings.resolve(flags: .init(), environment: ["ADTALLY_MAX_EVENT_AGE_DAYS": "60"])
        #expect(wide.maxEventAgeDays == 60)
        let error = #expect(throws: SettingsError.self) {
            try Settings.resolve(flags: .init(retentionDays: 30), environment: ["ADTALLY_MAX_EVENT_AGE_DAYS": "30"])
        }
        #expect(error?.description.contains("ADTALLY_MAX_EVENT_AGE_DAYS") == true)
        #expect(error?.description.contains("retention") == true)
    }

    @Test("reports read a replica only when DATABASE_READ_URL names one, within 30 s of lag unless told otherwise")
    func readReplica() throws {
        let defaults = try Settings.resolve(flags: .init(), environment: [:])
        #expect(defaults.databaseReadURL == nil && defaults.readMaxLagSeconds == 30)
        let environment = ["DATABASE_READ_URL": "postgresql://replica/db", "ADTALLY_READ_MAX_LAG_SECONDS": "5"]
        let fromEnvironment = try Settings.resolve(flags: .init(), environment: environment)
        #expect(fromEnvironment.databaseReadURL == "postgresql://replica/db" && fromEnvironment.readMaxLagSeconds == 5)
        var flags = Settings.Flags()
        flags.databaseReadURL = "postgresql://flag/db"
        flags.readMaxLagSeconds = 0
        let fromFlags = try Settings.resolve(flags: flags, environment: environment)
        #expect(fromFlags.databaseReadURL == "postgresql://flag/db" && fromFlags.readMaxLagSeconds == 0)
        let error = #expect(throws: SettingsError.self) {
            try Settings.resolve(flags: .init(), environment: ["ADTALLY_READ_MAX_LAG_SECONDS": "-1"])
        }
        #expect(error?.description.contains("ADTALLY_READ_MAX_LAG_SECONDS") == true)
    }

    @Test("a bad value names the variable and the rule")
    func badValues() {
        let error = #expect(throws: SettingsError.self) {
            try Settings.resolve(flags: .init(), environment: ["ADTALLY_PORT": "eighty"])
        }
        #expect(error?.description.contains("ADTALLY_PORT") == true)
        #expect(error?.description.contains("0 to 65535") == true)
    }
}

@Suite("SHA-256")
struct SHA256Tests {
    @Test("matches the FIPS 180-4 test vectors")
    func vectors() {
        #expect(SHA256.hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(SHA256.hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SHA256.hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")
            == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(SHA256.hex(String(repeating: "a", count: 1_000_000))
            == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    @Test("HMAC-SHA256 matches the RFC 4231 test vectors, long keys included")
    func hmacVectors() {
        #expect(SHA256.hmac(key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8)).hexString
            == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        #expect(SHA256.hmac(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)).hexString
            == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        // Case 6: a 131-byte key is hashed first.
        #expect(SHA256.hmac(key: [UInt8](repeating: 0xaa, count: 131), message: Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8)).hexString
            == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    }
}

@Suite("Concurrency gate")
struct ConcurrencyGateTests {
    @Test("admits up to its limit, turns the next away, and admits again after a leave")
    func gate() {
        let gate = ConcurrencyGate(limit: 2)
        #expect(gate.tryEnter())
        #expect(gate.tryEnter())
        #expect(!gate.tryEnter())
        gate.leave()
        #expect(gate.tryEnter())
        #expect(gate.holders == 2)
    }
}

/// ISO code lists the event and app rules check against.
public enum ISOCodes {
    /// ISO 3166-1 alpha-2 officially assigned codes, plus `ZZ` (unknown) and `XK`
    /// (Kosovo, user-assigned but what ad SDKs send).
    public static let countries: Set<String> = Set("""
        AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ
        CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR
        GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO
        JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR
        MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO
        RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV
        TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW XK ZZ
        """.split(whereSeparator: \.isWhitespace).map(String.init))

    /// ISO 4217 active currency codes with their minor-unit digits.
    public static let currencyDigits: [String: Int] = {
        var digits: [String: Int] = [:]
        for code in """
            AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BRL BSD BTN BWP BYN BZD CAD CDF CHF CNY COP
            CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR
            JMD KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN
            NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP
            SZL THB TJS TMT TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VES VND WST XAF XCD XOF XPF YER ZAR ZMW ZWG
            """.split(whereSeparator: \.isWhitespace) { digits[String(code)] = 2 }
        for code in ["BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF"] {
            digits[code] = 0
        }
        for code in ["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"] { digits[code] = 3 }
        return digits
    }()

    /// Whether `code` is an active ISO 4217 currency.
    public static func isCurrency(_ code: String) -> Bool { currencyDigits[code] != nil }

    /// The active ISO 4217 code `text` names in either case (`usd`, as spreadsheets
    /// and hand-written files have it), or nil.
    public static func currency(_ text: String) -> String? {
        guard let upper = asciiUppercased(text), isCurrency(upper) else { return nil }
        return upper
    }

    /// `text` in upper case when it is ASCII letters only, else nil: the codes are ASCII,
    /// and Unicode case mapping would make `ın` (a dotless i) or `ﬁ` into codes.
    public static func asciiUppercased(_ text: String) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case 0x41...0x5A: bytes.append(byte)
            case 0x61...0x7A: bytes.append(byte - 0x20)
            default: return nil
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

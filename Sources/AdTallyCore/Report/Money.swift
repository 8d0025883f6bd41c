/// Money as integer micros, shown in a currency's own precision (DESIGN §3).
public enum Money {
    /// a / b rounded half to even (banker's rounding), for b > 0.
    public static func divideHalfEven(_ a: Int128, by b: Int128) -> Int128 {
        precondition(b > 0, "divisor must be positive")
        if let a = Int64(exactly: a), let b = Int64(exactly: b) {
            // Native arithmetic for every realistic amount (an export formats millions).
            var quotient = a / b
            let twice = (a % b).magnitude * 2
            if twice > b.magnitude || (twice == b.magnitude && quotient % 2 != 0) { quotient += a < 0 ? -1 : 1 }
            return Int128(quotient)
        }
        var quotient = a / b
        let twice = (a % b).magnitude * 2
        if twice > b.magnitude || (twice == b.magnitude && quotient % 2 != 0) { quotient += a < 0 ? -1 : 1 }
        return quotient
    }

    /// Digits after the decimal point for a currency (ISO 4217 minor units; 2 when unknown).
    public static func digits(_ currency: String) -> Int { ISOCodes.currencyDigits[currency] ?? 2 }

    /// Micros as a decimal string in the currency's precision, rounded half to even:
    /// 1234567 USD is "1.23", JPY "1", KWD "1.235".
    public static func format(micros: Int128, currency: String) -> String {
        format(micros: micros, per: 1, digits: digits(currency))
    }

    /// `micros / per` micros (an exact fraction, e.g. an eCPM) as a decimal string with
    /// `digits` decimals (0 to 6), rounded half to even once.
    public static func format(micros: Int128, per: Int128, digits: Int) -> String {
        var out: [UInt8] = []
        append(micros: micros, per: per, digits: digits, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `micros / per` micros with `digits` decimals, rounded half to even once.
    public static func append(micros: Int128, per: Int128, digits: Int, to out: inout [UInt8]) {
        var scale: Int128 = 1
        for _ in 0..<(6 - digits) { scale *= 10 }
        let units = divideHalfEven(micros, by: per * scale)
        if units < 0 { out.append(UInt8(ascii: "-")) }
        var divisor: Int128 = 1
        for _ in 0..<digits { divisor *= 10 }
        let magnitude = Int128(units.magnitude)
        ReportText.appendInteger(magnitude / divisor, to: &out)
        guard digits > 0 else { return }
        out.append(UInt8(ascii: "."))
        let fraction = magnitude % divisor
        var place = divisor / 10
        while place > 0 {
            out.append(UInt8(truncatingIfNeeded: 0x30 + fraction / place % 10))
            place /= 10
        }
    }
}

/// Money as integer micros, shown in a currency's own precision (DESIGN §3).
public enum Money {
    /// a / b rounded half to even (banker's rounding), for b > 0.
    public static func divideHalfEven(_ a: Int128, by b: Int128) -> Int128 {
        precondition(b > 0, "divisor must be positive")
        var quotient = a / b
        let remainder = a % b
        // Twice the remainder against the divisor, without overflow for our magnitudes.
        let twice = remainder.magnitude * 2
        if twice > b.magnitude || (twice == b.magnitude && quotient % 2 != 0) {
            quotient += a < 0 ? -1 : 1
        }
        return quotient
    }

    /// Digits after the decimal point for a currency (ISO 4217 minor units; 2 when unknown).
    public static func digits(_ currency: String) -> Int { ISOCodes.currencyDigits[currency] ?? 2 }

    /// Micros as a decimal string in the currency's precision, rounded half to even:
    /// 1234567 USD is "1.23", JPY "1", KWD "1.235".
    public static func format(micros: Int128, currency: String) -> String {
        let digits = digits(currency)
        var scale: Int128 = 1
        for _ in 0..<(6 - digits) { scale *= 10 }
        let units = divideHalfEven(micros, by: scale)
        let negative = units < 0
        var text = String(units.magnitude)
        if digits > 0 {
            if text.count <= digits { text = String(repeating: "0", count: digits - text.count + 1) + text }
            text.insert(".", at: text.index(text.endIndex, offsetBy: -digits))
        }
        return negative ? "-" + text : text
    }
}

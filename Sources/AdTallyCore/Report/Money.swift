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
        format(micros: micros, digits: digits(currency))
    }

    /// Micros as a decimal string with `digits` decimals (0 to 6), rounded half to even.
    public static func format(micros: Int128, digits: Int) -> String {
        format(micros: micros, per: 1, digits: digits)
    }

    /// `micros / per` micros (an exact fraction, e.g. an eCPM) as a decimal string with
    /// `digits` decimals, rounded half to even once.
    public static func format(micros: Int128, per: Int128, digits: Int) -> String {
        var out: [UInt8] = []
        append(micros: micros, per: per, digits: digits, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `micros / per` micros with `digits` decimals, rounded half to even once.
    public static func append(micros: Int128, per: Int128, digits: Int, to out: inout [UInt8]) {
        if per == 1 { return append(micros: micros, digits: digits, to: &out) }
        var scale: Int128 = 1
        for _ in 0..<(6 - digits) { scale *= 10 }
        let units = divideHalfEven(micros, by: per * scale)
        if units < 0 { out.append(UInt8(ascii: "-")) }
        if let small = UInt64(exactly: units.magnitude) {
            appendUnits(small, digits: digits, to: &out)
        } else {
            out.append(contentsOf: formatWide(micros: units.magnitude > 0 ? Int128(units.magnitude) * scale : 0, digits: digits).utf8)
        }
    }

    /// Appends micros as a decimal string with `digits` decimals, rounded half to even.
    public static func append(micros: Int128, digits: Int, to out: inout [UInt8]) {
        if let small = Int64(exactly: micros), small.magnitude < 1 << 62 {
            // Native arithmetic for every realistic amount.
            var scale: Int64 = 1
            for _ in 0..<(6 - digits) { scale *= 10 }
            var units = small / scale
            let remainder = small % scale
            let twice = remainder.magnitude * 2
            if twice > UInt64(scale) || (twice == UInt64(scale) && units % 2 != 0) { units += small < 0 ? -1 : 1 }
            if units < 0 { out.append(UInt8(ascii: "-")) }
            appendUnits(units.magnitude, digits: digits, to: &out)
            return
        }
        out.append(contentsOf: formatWide(micros: micros, digits: digits).utf8)
    }

    static func appendUnits(_ units: UInt64, digits: Int, to out: inout [UInt8]) {
        var divisor: UInt64 = 1
        for _ in 0..<digits { divisor *= 10 }
        ReportText.appendInteger(Int128(units / divisor), to: &out)
        guard digits > 0 else { return }
        out.append(UInt8(ascii: "."))
        let fraction = units % divisor
        var place = divisor / 10
        while place > 0 {
            out.append(UInt8(truncatingIfNeeded: 0x30 &+ fraction / place % 10))
            place /= 10
        }
    }

    static func formatWide(micros: Int128, digits: Int) -> String {
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

/// ISO 8601 timestamps as RFC 3339 and PostgreSQL's ISO output write them.
public enum ISOTimestamp {
    /// What a parser accepts besides `YYYY-MM-DD?HH:MM:SS[.fraction]`.
    public struct Rules: Sendable {
        /// Whether a zone offset (`Z`, `+HH:MM`) must be present.
        public var requiresOffset: Bool
        /// Whether an offset may be written `+HH` (PostgreSQL) instead of `+HH:MM` (RFC 3339).
        public var allowsHourOnlyOffset: Bool

        /// RFC 3339: `T` or space, offset required, `Z` or `±HH:MM`.
        public static let rfc3339 = Rules(requiresOffset: true, allowsHourOnlyOffset: false)
        /// PostgreSQL `timestamptz` output with DateStyle ISO: `±HH`, `±HH:MM` or `±HH:MM:SS`.
        public static let postgres = Rules(requiresOffset: false, allowsHourOnlyOffset: true)
    }

    /// Microseconds since the epoch, or nil when `text` breaks the rules or names
    /// an impossible date or time. Fractions beyond microseconds are truncated.
    public static func parseMicros(_ text: String, rules: Rules) -> Int64? {
        var text = text
        return text.withUTF8 { parse($0, rules: rules) }
    }

    static func parse(_ chars: UnsafeBufferPointer<UInt8>, rules: Rules) -> Int64? {
        var index = 0
        func number(_ count: Int) -> Int? {
            guard index + count <= chars.count else { return nil }
            var value = 0
            for offset in 0..<count {
                let char = chars[index + offset]
                guard char >= 48, char <= 57 else { return nil }
                value = value * 10 + Int(char - 48)
            }
            index += count
            return value
        }
        func take(_ options: StaticString) -> Bool {
            guard index < chars.count else { return false }
            let allowed = UnsafeBufferPointer(start: options.utf8Start, count: options.utf8CodeUnitCount)
            guard allowed.contains(chars[index]) else { return false }
            index += 1
            return true
        }
        guard let year = number(4), take("-"), let month = number(2), take("-"), let day = number(2), take("Tt "),
              let hour = number(2), take(":"), let minute = number(2), take(":"), let second = number(2),
              (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year),
              hour <= 23, minute <= 59, second <= 60
        else { return nil }
        var micros = 0
        if take(".") {
            var digits = 0
            while index < chars.count, chars[index] >= 48, chars[index] <= 57 {
                if digits < 6 { micros = micros * 10 + Int(chars[index] - 48) }
                digits += 1
                index += 1
            }
            guard digits > 0 else { return nil }
            for _ in digits..<max(digits, 6) { micros *= 10 }
        }
        var offsetSeconds = 0
        if take("Zz") {
            offsetSeconds = 0
        } else if index < chars.count {
            let sign: Int
            if take("+") { sign = 1 } else if take("-") { sign = -1 } else { return nil }
            guard let hours = number(2), hours <= 23 else { return nil }
            var minutes = 0
            var seconds = 0
            if take(":") {
                guard let value = number(2), value <= 59 else { return nil }
                minutes = value
                if rules.allowsHourOnlyOffset, take(":") {
                    guard let value = number(2), value <= 59 else { return nil }
                    seconds = value
                }
            } else if !rules.allowsHourOnlyOffset {
                return nil
            }
            offsetSeconds = sign * (hours * 3600 + minutes * 60 + seconds)
        } else if rules.requiresOffset {
            return nil
        }
        guard index == chars.count else { return nil }
        let days = CivilTime.days(year: year, month: month, day: day)
        // A leap second (:60) folds into the next second.
        let total = days * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        return Int64(total) * 1_000_000 + Int64(micros)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}

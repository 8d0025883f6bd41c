import TextFormats

/// RFC 3339 timestamps with a mandatory offset, e.g. `2026-11-21T10:31:19.5+05:30`.
public enum RFC3339 {
    /// Microseconds since the Unix epoch, or nil when `text` is not RFC 3339 with an offset.
    public static func parseMicros(_ text: String) -> Int64? {
        var text = text
        return text.withUTF8 { parse(Array($0)) }
    }

    static func parse(_ chars: [UInt8]) -> Int64? {
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
        func take(_ options: String) -> Bool {
            guard index < chars.count, options.utf8.contains(chars[index]) else { return false }
            index += 1
            return true
        }
        guard let year = number(4), take("-"), let month = number(2), take("-"), let day = number(2), take("Tt "),
              let hour = number(2), take(":"), let minute = number(2), take(":"), let second = number(2)
        else { return nil }
        guard (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year),
              hour <= 23, minute <= 59, second <= 60 else { return nil }
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
        } else {
            let sign: Int
            if take("+") { sign = 1 } else if take("-") { sign = -1 } else { return nil }
            guard let hours = number(2), take(":"), let minutes = number(2), hours <= 23, minutes <= 59 else { return nil }
            offsetSeconds = sign * (hours * 3600 + minutes * 60)
        }
        guard index == chars.count else { return nil }
        let days = CivilTime.days(year: year, month: month, day: day)
        // A leap second (:60) is folded into the next second.
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        return Int64(seconds) * 1_000_000 + Int64(micros)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}

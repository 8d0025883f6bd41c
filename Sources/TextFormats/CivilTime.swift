/// Proleptic Gregorian calendar arithmetic on UTC days and microseconds, without
/// Foundation: hot paths (ingest, COPY) format and parse timestamps with it.
public enum CivilTime {
    /// Days since 1970-01-01 of a date (Howard Hinnant's `days_from_civil`).
    public static func days(year: Int, month: Int, day: Int) -> Int {
        let shiftedYear = month <= 2 ? year - 1 : year
        let era = (shiftedYear >= 0 ? shiftedYear : shiftedYear - 399) / 400
        let yearOfEra = shiftedYear - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The date of a day number (`civil_from_days`).
    public static func date(days: Int) -> (year: Int, month: Int, day: Int) {
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    /// Appends `YYYY-MM-DD HH:MM:SS.ffffff+00` (PostgreSQL's ISO output in UTC) for
    /// microseconds since the epoch.
    public static func appendTimestamp(micros: Int64, to out: inout [UInt8]) {
        var seconds = micros / 1_000_000
        var fraction = micros % 1_000_000
        if fraction < 0 { fraction += 1_000_000; seconds -= 1 }
        var days = seconds / 86_400
        var secondOfDay = seconds % 86_400
        if secondOfDay < 0 { secondOfDay += 86_400; days -= 1 }
        let (year, month, day) = date(days: Int(days))
        appendDigits(year, 4, &out)
        out.append(UInt8(ascii: "-"))
        appendDigits(month, 2, &out)
        out.append(UInt8(ascii: "-"))
        appendDigits(day, 2, &out)
        out.append(UInt8(ascii: " "))
        appendDigits(Int(secondOfDay / 3600), 2, &out)
        out.append(UInt8(ascii: ":"))
        appendDigits(Int(secondOfDay / 60 % 60), 2, &out)
        out.append(UInt8(ascii: ":"))
        appendDigits(Int(secondOfDay % 60), 2, &out)
        out.append(UInt8(ascii: "."))
        appendDigits(Int(fraction), 6, &out)
        out.append(UInt8(ascii: "+"))
        out.append(UInt8(ascii: "0"))
        out.append(UInt8(ascii: "0"))
    }

    /// The same as a String.
    public static func timestamp(micros: Int64) -> String {
        var out = [UInt8]()
        out.reserveCapacity(29)
        appendTimestamp(micros: micros, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    static func appendDigits(_ value: Int, _ width: Int, _ out: inout [UInt8]) {
        var digits = (UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0))
        var remaining = value < 0 ? 0 : value
        withUnsafeMutableBytes(of: &digits) { buffer in
            for index in stride(from: width - 1, through: 0, by: -1) {
                buffer[index] = UInt8(48 + remaining % 10)
                remaining /= 10
            }
            out.append(contentsOf: buffer[0..<width])
        }
        if remaining > 0 {
            // A year past 9999: rare; write it in full.
            out.removeLast(width)
            out.append(contentsOf: String(value).utf8)
        }
    }
}

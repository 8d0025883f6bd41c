import Foundation
import TextFormats

/// A cron expression that does not parse: names the field and the rule.
public struct CronError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong.
    public var message: String

    init(_ message: String) { self.message = message }

    public var description: String { message }
}

/// One time a schedule is due: its wall time in the schedule's zone (the slot's
/// name) and the instant it is due.
public struct CronSlot: Sendable, Equatable, Hashable {
    /// Seconds since 1970-01-01T00:00:00Z at which the slot is due.
    public var due: Int64
    /// The slot's wall time in its zone, as days since 1970-01-01 and minutes of the day.
    public var day: Int
    /// Minutes since local midnight.
    public var minuteOfDay: Int

    /// `YYYYMMDDTHHMM`, the wall time the cron expression named (DESIGN §5 file names).
    public var name: String {
        let date = CivilTime.date(days: day)
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let year = String(date.year)
        return String(repeating: "0", count: max(0, 4 - year.count)) + year + two(date.month) + two(date.day)
            + "T" + two(minuteOfDay / 60) + two(minuteOfDay % 60)
    }

    /// The wall time as seconds since 1970 as if the zone were UTC.
    public var wall: Int64 { Int64(day) * 86_400 + Int64(minuteOfDay) * 60 }

    /// The instant the slot is due.
    public var dueDate: Date { Date(timeIntervalSince1970: TimeInterval(due)) }
}

/// A 5-field cron expression — minute, hour, day of month, month, day of week —
/// as crontab(5) reads it (lists, ranges, steps, month and weekday names, 7 for
/// Sunday, and the day fields OR-ed when both are restricted), plus `@hourly`,
/// `@daily`, `@weekly`, `@monthly` and `@yearly`, evaluated in an IANA zone.
///
/// Daylight saving time, decided so that every wall time a schedule names runs
/// once and slot names (wall times) never repeat:
/// - a wall time the clocks skip (02:30 on a spring-forward day in New York) is due
///   at the moment of the change (03:00 EDT), once, beside the slot of 03:00 itself;
/// - a wall time the clocks repeat (01:30 on a fall-back day) is due at its first
///   occurrence only.
public struct CronSchedule: Sendable, Equatable {
    /// The expression as given.
    public let text: String
    let minutes: [Int]
    let hours: [Int]
    let daysOfMonth: Set<Int>
    let months: Set<Int>
    /// 0 = Sunday … 6 = Saturday.
    let daysOfWeek: Set<Int>
    let isDayOfMonthRestricted: Bool
    let isDayOfWeekRestricted: Bool

    static let macros = [
        "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
    ]
    static let monthNames = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    static let dayNames = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

    /// Parses an expression; the error names the field and what it allows.
    public init(_ text: String) throws(CronError) {
        self.text = text
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let expanded = Self.macros[trimmed.lowercased()] ?? trimmed
        let fields = expanded.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        guard fields.count == 5 else {
            throw CronError("a cron expression has 5 fields (minute hour day-of-month month day-of-week, e.g. \"30 6 * * 1-5\") or is one of \(Self.macros.keys.sorted().joined(separator: ", ")); got \(fields.count) field\(fields.count == 1 ? "" : "s")")
        }
        minutes = try Self.field(fields[0], name: "minute", range: 0...59, names: []).sorted()
        hours = try Self.field(fields[1], name: "hour", range: 0...23, names: []).sorted()
        daysOfMonth = try Self.field(fields[2], name: "day of month", range: 1...31, names: [])
        months = try Self.field(fields[3], name: "month", range: 1...12, names: Self.monthNames, firstNameValue: 1)
        daysOfWeek = Set(try Self.field(fields[4], name: "day of week", range: 0...7, names: Self.dayNames).map { $0 % 7 })
        isDayOfMonthRestricted = !fields[2].hasPrefix("*")
        isDayOfWeekRestricted = !fields[4].hasPrefix("*")
        // A day of month that no chosen month has (30 February) never runs: refuse it.
        let longest = months.map { [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][$0 - 1] }.max() ?? 31
        if isDayOfMonthRestricted, !isDayOfWeekRestricted, daysOfMonth.allSatisfy({ $0 > longest }) {
            throw CronError("day of month: no chosen month has day \(daysOfMonth.min()!), so the schedule would never run")
        }
    }

    private static func field(_ text: String, name: String, range: ClosedRange<Int>, names: [String], firstNameValue: Int = 0) throws(CronError) -> Set<Int> {
        func value(_ part: Substring) throws(CronError) -> Int {
            if let number = Int(part), range.contains(number) { return number }
            if let index = names.firstIndex(of: part.lowercased()) { return index + firstNameValue }
            let named = names.isEmpty ? "" : " or a name (\(names.first!)…\(names.last!))"
            throw CronError("\(name): \"\(part)\" is not a number from \(range.lowerBound) to \(range.upperBound)\(named)")
        }
        var values = Set<Int>()
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let stepParts = item.split(separator: "/", omittingEmptySubsequences: false)
            guard stepParts.count <= 2, !stepParts[0].isEmpty else {
                throw CronError("\(name): \"\(item)\" is not a value, a range (a-b), * or one of them with a step (/n)")
            }
            var step = 1
            if stepParts.count == 2 {
                guard let parsed = Int(stepParts[1]), parsed >= 1, parsed <= range.upperBound else {
                    throw CronError("\(name): the step in \"\(item)\" must be a number from 1 to \(range.upperBound)")
                }
                step = parsed
            }
            let lower: Int, upper: Int
            if stepParts[0] == "*" {
                (lower, upper) = (range.lowerBound, range.upperBound)
            } else if let dash = stepParts[0].firstIndex(of: "-") {
                lower = try value(stepParts[0][..<dash])
                upper = try value(stepParts[0][stepParts[0].index(after: dash)...])
                guard lower <= upper else { throw CronError("\(name): the range \"\(stepParts[0])\" runs backwards") }
            } else {
                lower = try value(stepParts[0])
                upper = stepParts.count == 2 ? range.upperBound : lower
            }
            values.formUnion(stride(from: lower, through: upper, by: step))
        }
        return values
    }

    /// Whether the schedule runs on a local date (days since 1970-01-01). As cron(8)
    /// does: when both day fields are restricted a day matching either runs; when
    /// either starts with `*` (`*/2` included) a day must match both sets.
    func runs(onDay day: Int) -> Bool {
        let date = CivilTime.date(days: day)
        guard months.contains(date.month) else { return false }
        // 1970-01-01 was a Thursday (4).
        let weekday = ((day + 4) % 7 + 7) % 7
        let dayOfMonth = daysOfMonth.contains(date.day), dayOfWeek = daysOfWeek.contains(weekday)
        return isDayOfMonthRestricted && isDayOfWeekRestricted ? dayOfMonth || dayOfWeek : dayOfMonth && dayOfWeek
    }

    /// The first slot whose wall time is later than `wall`. Due instants never fall as
    /// wall times rise, so slots are enumerated in wall-time order.
    func nextSlot(afterWall wall: Int64, in zone: TimeZone) -> CronSlot? {
        let firstDay = Int(wall.floorDiv(86_400))
        for day in firstDay...(firstDay + 366 * 8) where runs(onDay: day) {
            let midnight = Int64(day) * 86_400
            for hour in hours where midnight + Int64(hour * 3600 + 59 * 60) > wall {
                for minute in minutes {
                    let candidate = midnight + Int64(hour * 3600 + minute * 60)
                    if candidate <= wall { continue }
                    return CronSlot(due: Self.instant(ofWallTime: candidate, in: zone), day: day, minuteOfDay: hour * 60 + minute)
                }
            }
        }
        return nil
    }

    /// The first slot due strictly after `instant` (seconds since 1970), or nil when
    /// none comes in the next 8 years (29 February on a Monday-only schedule…).
    public func nextSlot(after instant: Int64, in zone: TimeZone) -> CronSlot? {
        let local = instant + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instant))))
        // Offsets move a wall time by at most a few hours from its instant.
        var wall = local - 4 * 3600
        while let slot = nextSlot(afterWall: wall, in: zone) {
            if slot.due > instant { return slot }
            wall = slot.wall
        }
        return nil
    }

    /// The slots due in (`after`, `through`], at most `limit` of them, in wall-time order.
    /// Wall times the clocks skip share the instant of the change with the first real
    /// wall time after it; each is a slot of its own.
    public func slots(after: Int64, through: Int64, in zone: TimeZone, limit: Int) -> [CronSlot] {
        var slots: [CronSlot] = []
        var next = nextSlot(after: after, in: zone)
        while slots.count < limit, let slot = next, slot.due <= through {
            slots.append(slot)
            next = nextSlot(afterWall: slot.wall, in: zone)
        }
        return slots
    }

    /// The instant a wall time (seconds since 1970 as if the zone were UTC) is due:
    /// its first occurrence, or the moment clocks jump over it.
    static func instant(ofWallTime wall: Int64, in zone: TimeZone) -> Int64 {
        func offset(_ instant: Int64) -> Int64 { Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instant)))) }
        let before = offset(wall - 43_200), after = offset(wall + 43_200)
        let candidates = Set([before, after]).map { wall - $0 }.filter { offset($0) == wall - $0 }
        if let first = candidates.min() { return first }
        // Skipped: the clocks jumped from `before` to `after` somewhere in (wall - after, wall - before].
        var low = wall - after, high = wall - before
        while low + 1 < high {
            let middle = low + (high - low) / 2
            if offset(middle) == before { low = middle } else { high = middle }
        }
        return high
    }
}

extension Int64 {
    /// Division rounding towards negative infinity.
    func floorDiv(_ divisor: Int64) -> Int64 {
        let quotient = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? quotient - 1 : quotient
    }
}

extension CronSlot {
    /// The minute of `instant` in `zone` as a slot due at `instant` (a manual run's slot).
    public static func minute(containing instant: Int64, in zone: TimeZone) -> CronSlot {
        let local = instant + Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instant))))
        let day = local.floorDiv(86_400)
        return CronSlot(due: instant, day: Int(day), minuteOfDay: Int((local - day * 86_400) / 60))
    }
}

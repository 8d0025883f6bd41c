/// Reads submitted event batches — `{"events": [...]}` JSON or NDJSON — into raw events.
///
/// A hand-written reader: events are flat objects, and this keeps ingest close to
/// COPY speed and errors precise (byte offset, line, field).
public enum EventBatchReader {
    /// One submitted event: its fields, or why it could not be read.
    public enum Slot: Sendable, Equatable {
        case event(RawEvent)
        case unreadable(String)
    }

    /// Parses a `{"events": [...]}` body. Throws when the body is not readable JSON
    /// of that shape; an element that is not an object becomes an `.unreadable` slot.
    /// Stops at element `maxEvents + 1` and throws `BodyError.tooManyEvents`: a body
    /// of tiny elements (`{},{},…`) never becomes more slots than the limit.
    public static func readJSON(_ bytes: [UInt8], maxEvents: Int = .max) throws(BodyError) -> [Slot] {
        try bytes.withUnsafeBufferPointer { buffer throws(BodyError) in try readJSON(buffer, maxEvents: maxEvents) }
    }

    /// The same, over bytes in place.
    public static func readJSON(_ buffer: UnsafeBufferPointer<UInt8>, maxEvents: Int = .max) throws(BodyError) -> [Slot] {
        do {
            var scanner = JSONScanner(buffer)
            var slots: [Slot] = []
            var sawEvents = false
            scanner.skipByteOrderMark()
            scanner.skipWhitespace()
            try scanner.expect(UInt8(ascii: "{"), "the body must be a JSON object {\"events\": [...]}")
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "}") {
                scanner.index += 1
            } else {
                while true {
                    scanner.skipWhitespace()
                    let key = try scanner.readString()
                    scanner.skipWhitespace()
                    try scanner.expect(UInt8(ascii: ":"), "expected ':' after \"\(key)\"")
                    scanner.skipWhitespace()
                    if key == "events" {
                        sawEvents = true
                        try scanner.expect(UInt8(ascii: "["), "\"events\" must be an array")
                        scanner.skipWhitespace()
                        if scanner.peek() == UInt8(ascii: "]") {
                            scanner.index += 1
                        } else {
                            while true {
                                scanner.skipWhitespace()
                                guard slots.count < maxEvents else { throw BodyError.tooManyEvents(maxEvents) }
                                if scanner.peek() == UInt8(ascii: "{") {
                                    slots.append(.event(try scanner.readEvent()))
                                } else {
                                    let value = try scanner.readValue()
                                    slots.append(.unreadable("event must be a JSON object, got \(value.kindName)"))
                                }
                                scanner.skipWhitespace()
                                if scanner.peek() == UInt8(ascii: ",") { scanner.index += 1; continue }
                                try scanner.expect(UInt8(ascii: "]"), "expected ',' or ']' in \"events\"")
                                break
                            }
                        }
                    } else {
                        _ = try scanner.readValue()
                    }
                    scanner.skipWhitespace()
                    if scanner.peek() == UInt8(ascii: ",") { scanner.index += 1; continue }
                    try scanner.expect(UInt8(ascii: "}"), "expected ',' or '}' in the body object")
                    break
                }
            }
            scanner.skipWhitespace()
            guard scanner.atEnd else { throw scanner.failure("unexpected data after the body object") }
            guard sawEvents else { throw BodyError(message: "the body has no \"events\" array") }
            return slots
        }
    }

    /// Parses NDJSON: one event object per non-blank line. A line that is not a JSON
    /// object becomes an `.unreadable` slot naming its line, so one bad line loses
    /// only itself.
    /// Stops at line `maxEvents + 1` that is not blank and throws `BodyError.tooManyEvents`.
    public static func readNDJSON(_ bytes: [UInt8], maxEvents: Int = .max) throws(BodyError) -> [Slot] {
        try bytes.withUnsafeBufferPointer { buffer throws(BodyError) in try readNDJSON(buffer, maxEvents: maxEvents) }
    }

    /// The same, over bytes in place.
    public static func readNDJSON(_ buffer: UnsafeBufferPointer<UInt8>, maxEvents: Int = .max) throws(BodyError) -> [Slot] {
        do {
            var slots: [Slot] = []
            var lineStart = 0
            var lineNumber = 0
            while lineStart < buffer.count {
                var lineEnd = lineStart
                while lineEnd < buffer.count, buffer[lineEnd] != UInt8(ascii: "\n") { lineEnd += 1 }
                lineNumber += 1
                let line = UnsafeBufferPointer(rebasing: buffer[lineStart..<lineEnd])
                if let slot = readLine(line, number: lineNumber) {
                    guard slots.count < maxEvents else { throw BodyError.tooManyEvents(maxEvents) }
                    slots.append(slot)
                }
                lineStart = lineEnd + 1
            }
            return slots
        }
    }

    /// Reads one NDJSON line; nil for a blank line.
    public static func readLine(_ line: UnsafeBufferPointer<UInt8>, number: Int) -> Slot? {
        var scanner = JSONScanner(line)
        if number == 1 { scanner.skipByteOrderMark() }
        scanner.skipWhitespace()
        if scanner.atEnd { return nil }
        do throws(BodyError) {
            guard scanner.peek() == UInt8(ascii: "{") else {
                return .unreadable("line \(number): event must be a JSON object")
            }
            let event = try scanner.readEvent()
            scanner.skipWhitespace()
            guard scanner.atEnd else { return .unreadable("line \(number): unexpected data after the event object") }
            return .event(event)
        } catch {
            return .unreadable("line \(number): \(error.message)")
        }
    }
}

/// A body that cannot be read at all.
public struct BodyError: Error, Sendable, Equatable {
    /// What is wrong, with the byte offset where it was found.
    public var message: String
    /// Whether the body holds more events than allowed (a 413, not a 400).
    public var isTooManyEvents = false
    /// Creates an error.
    public init(message: String) { self.message = message }

    /// More than `limit` events: reading stopped at the one past it.
    public static func tooManyEvents(_ limit: Int) -> BodyError {
        var error = BodyError(message: "more than \(limit) events in one request; the limit is \(limit)")
        error.isTooManyEvents = true
        return error
    }
}

/// A forward-only JSON scanner over bytes.
struct JSONScanner {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0

    init(_ bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    var atEnd: Bool { index >= bytes.count }

    func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    /// Skips a UTF-8 byte-order mark at the very start (editors on Windows write one).
    mutating func skipByteOrderMark() {
        if index == 0, bytes.count >= 3, bytes[0] == 0xEF, bytes[1] == 0xBB, bytes[2] == 0xBF { index = 3 }
    }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    func failure(_ message: String) -> BodyError {
        BodyError(message: "invalid JSON at byte \(index): \(message)")
    }

    mutating func expect(_ byte: UInt8, _ message: String) throws(BodyError) {
        guard peek() == byte else { throw failure(message) }
        index += 1
    }

    /// Reads a flat event object into a `RawEvent`; unknown fields are skipped.
    mutating func readEvent() throws(BodyError) -> RawEvent {
        var event = RawEvent()
        try expect(UInt8(ascii: "{"), "expected '{'")
        skipWhitespace()
        if peek() == UInt8(ascii: "}") { index += 1; return event }
        while true {
            skipWhitespace()
            let key = try readKey()
            skipWhitespace()
            try expect(UInt8(ascii: ":"), "expected ':' after a field name")
            skipWhitespace()
            let valueStart = index
            let value = try readValue()
            let outcome: RawEvent.SetOutcome
            switch key {
            case .raw(let name): outcome = event.set(nameBytes: name, value)
            case .decoded(let name): outcome = event.set(name, value)
            }
            if outcome == .duplicate {
                index = valueStart
                throw failure("the field \"\(key.text)\" appears twice in one event")
            }
            skipWhitespace()
            if peek() == UInt8(ascii: ",") { index += 1; continue }
            try expect(UInt8(ascii: "}"), "expected ',' or '}' in an event")
            return event
        }
    }

    mutating func readValue() throws(BodyError) -> RawValue {
        guard let byte = peek() else { throw failure("expected a value") }
        switch byte {
        case UInt8(ascii: "\""): return .string(try readString())
        case UInt8(ascii: "t"): try readLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try readLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try readLiteral("null"); return .null
        case UInt8(ascii: "{"), UInt8(ascii: "["): try skipComposite(); return .composite
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try readNumber())
        default: throw failure("unexpected character")
        }
    }

    private mutating func readLiteral(_ word: StaticString) throws(BodyError) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw failure("unexpected end") }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw failure("unexpected character")
        }
        index += count
    }

    private mutating func readNumber() throws(BodyError) -> String {
        let start = index
        if peek() == UInt8(ascii: "-") { index += 1 }
        var digits = 0
        while let byte = peek(), byte >= 0x30, byte <= 0x39 { index += 1; digits += 1 }
        guard digits > 0 else { throw failure("a number needs digits") }
        if peek() == UInt8(ascii: ".") {
            index += 1
            var fraction = 0
            while let byte = peek(), byte >= 0x30, byte <= 0x39 { index += 1; fraction += 1 }
            guard fraction > 0 else { throw failure("a number needs digits after '.'") }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            var exponent = 0
            while let byte = peek(), byte >= 0x30, byte <= 0x39 { index += 1; exponent += 1 }
            guard exponent > 0 else { throw failure("a number needs exponent digits") }
        }
        return String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
    }

    /// A field name: bytes of the body when it has no escapes (no String made),
    /// decoded otherwise.
    enum Key {
        case raw(UnsafeBufferPointer<UInt8>)
        case decoded(String)

        var text: String {
            switch self {
            case .raw(let bytes): String(decoding: bytes, as: UTF8.self)
            case .decoded(let text): text
            }
        }
    }

    mutating func readKey() throws(BodyError) -> Key {
        if peek() == UInt8(ascii: "\"") {
            var probe = index + 1
            while probe < bytes.count, bytes[probe] != UInt8(ascii: "\""), bytes[probe] != UInt8(ascii: "\\"), bytes[probe] >= 0x20 {
                probe += 1
            }
            if probe < bytes.count, bytes[probe] == UInt8(ascii: "\"") {
                defer { index = probe + 1 }
                return .raw(UnsafeBufferPointer(rebasing: bytes[(index + 1)..<probe]))
            }
        }
        return .decoded(try readString())
    }

    mutating func readString() throws(BodyError) -> String {
        try expect(UInt8(ascii: "\""), "expected a string")
        let start = index
        // Fast path: no escapes. ASCII (ids, names, timestamps) needs no UTF-8 validation.
        var isASCII = true
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
                index += 1
                if isASCII {
                    return String(unsafeUninitializedCapacity: slice.count) { target in
                        _ = target.initialize(from: slice)
                        return slice.count
                    }
                }
                guard let text = String(validating: slice, as: UTF8.self) else { throw failure("string is not valid UTF-8") }
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw failure("control character in a string") }
            if byte >= 0x80 { isASCII = false }
            index += 1
        }
        var out = Array(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                guard let text = String(validating: out, as: UTF8.self) else { throw failure("string is not valid UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                guard let escaped = peek() else { throw failure("unterminated escape") }
                index += 1
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escaped)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try readHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard peek() == UInt8(ascii: "\\") else { throw failure("unpaired surrogate") }
                        index += 1
                        guard peek() == UInt8(ascii: "u") else { throw failure("unpaired surrogate") }
                        index += 1
                        let low = try readHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw failure("unpaired surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw failure("unpaired surrogate")
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw failure("invalid \\u escape") }
                    out.append(contentsOf: String(Character(unicode)).utf8)
                default: throw failure("invalid escape")
                }
            default:
                if byte < 0x20 { throw failure("control character in a string") }
                out.append(byte)
            }
        }
        throw failure("unterminated string")
    }

    private mutating func readHex4() throws(BodyError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw failure("short \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            index += 1
            let digit: UInt32
            switch byte {
            case 0x30...0x39: digit = UInt32(byte - 0x30)
            case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
            case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
            default: throw failure("invalid \\u escape")
            }
            value = value << 4 | digit
        }
        return value
    }

    /// Skips an array or object, checking its syntax.
    private mutating func skipComposite() throws(BodyError) {
        var depth = 0
        repeat {
            skipWhitespace()
            guard let byte = peek() else { throw failure("unterminated array or object") }
            switch byte {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
                guard depth <= 64 else { throw failure("nested too deeply") }
                index += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                depth -= 1
                index += 1
            case UInt8(ascii: ","), UInt8(ascii: ":"):
                index += 1
            default:
                _ = try readValue()
            }
        } while depth > 0
    }
}

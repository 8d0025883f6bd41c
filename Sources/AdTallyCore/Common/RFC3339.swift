import TextFormats

/// RFC 3339 timestamps with a mandatory offset, e.g. `2026-11-21T10:31:19.5+05:30`.
public enum RFC3339 {
    /// Microseconds since the Unix epoch, or nil when `text` is not RFC 3339 with an offset.
    public static func parseMicros(_ text: String) -> Int64? {
        ISOTimestamp.parseMicros(text, rules: .rfc3339)
    }
}

import Foundation

/// A value that breaks a rule: the field, as the API or the file names it, and the
/// rule. Rate cards and FX rates, export schedules and mediation policies refuse
/// input with it; the HTTP layer answers 400 with its text, the CLI names its option.
public struct FieldError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The field at fault.
    public var field: String
    /// What it must be.
    public var rule: String

    /// An error about one field.
    public init(_ field: String, _ rule: String) {
        self.field = field
        self.rule = rule
    }

    public var description: String { "\(field): \(rule)" }
}

extension FieldError {
    /// Whether `name` is a name admins give things that also name files and URL paths:
    /// 1 to 64 of a-z, 0-9, `-` and `_`, starting with a letter or digit.
    public static func isName(_ name: String) -> Bool {
        guard name.utf8.count <= 64, let first = name.utf8.first, (0x61...0x7A).contains(first) || (0x30...0x39).contains(first) else { return false }
        return name.utf8.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F }
    }

    /// The rule `isName` checks, as an error says it.
    public static let nameRule = "must be 1 to 64 of a-z, 0-9, - and _, starting with a letter or digit"

    /// Checks a URL AdTally sends requests to (a network's API, a webhook): http or
    /// https with a host, no credentials or fragment, at most 2,000 bytes.
    public static func checkURL(_ text: String, field: String) throws(FieldError) {
        guard text.utf8.count <= 2000, let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), let host = url.host, !host.isEmpty,
              url.user == nil, url.fragment == nil
        else { throw FieldError(field, "must be an http or https URL with a host, without credentials or a fragment, of at most 2,000 bytes") }
    }
}

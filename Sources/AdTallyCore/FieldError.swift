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

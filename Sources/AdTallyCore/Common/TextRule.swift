/// The one length rule of every free text field (placements, versions, devices, app
/// names): at most `characters` characters as a person counts them (grapheme
/// clusters, DESIGN §2's limits) and at most `bytes` bytes of UTF-8, four a character.
///
/// Both, because either alone can be gamed: a letter followed by 500,000 combining
/// marks is one character, and 22 Japanese characters are 66 bytes. The same rule is
/// applied at ingest, in report filters, in mediation policies and in exports (their
/// queries are report queries), so a value accepted in one place is usable in all.
public struct TextRule: Sendable, Equatable {
    /// The most characters.
    public let characters: Int
    /// The most UTF-8 bytes.
    public var bytes: Int { characters * 4 }

    /// A rule of `characters` characters.
    public init(characters: Int) { self.characters = characters }

    /// Placements: 1 to 64 characters.
    public static let placement = TextRule(characters: 64)
    /// `os_version`, `app_version`: at most 32 characters.
    public static let version = TextRule(characters: 32)
    /// `device`: at most 64 characters.
    public static let device = TextRule(characters: 64)
    /// App names: 1 to 200 characters.
    public static let appName = TextRule(characters: 200)

    /// Whether `text` is within both limits (the bytes are checked first, so no
    /// grapheme walk ever runs over a long text). Emptiness is the caller's rule.
    public func allows(_ text: String) -> Bool {
        let count = text.utf8.count
        // A string never has more characters than bytes: short text needs no walk.
        return count <= characters || (count <= bytes && text.count <= characters)
    }

    /// "at most 64 characters (256 bytes of UTF-8)", for rules that name it.
    public var limitText: String { "at most \(characters) characters (\(bytes) bytes of UTF-8)" }
}

/// Text put into a command line a message suggests, for a POSIX shell.
public enum ShellText {
    /// `text` as one shell word: as it is when plain, else single-quoted with each `'`
    /// written `'\''`, so that a name holding quotes, `;` or `$(…)` is a word, never code.
    public static func quoted(_ text: String) -> String {
        if !text.isEmpty, text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "/._-+=:,@".contains($0)) }) { return text }
        return "'" + text.replacingOccurrences(of: "'", with: #"'\''"#) + "'"
    }
}

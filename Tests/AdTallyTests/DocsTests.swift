import Foundation
import AdTallyTestSupport
import Testing

/// The pages a newcomer reads are true to the code: every link leads somewhere, and
/// every `adtally` command, option, `make` target, HTTP route and file they show exists.
/// The CLI is asked (`--experimental-dump-help`, then `--help` per command), the
/// Makefile read, the routes matched against the served OpenAPI file.
@Suite("Docs")
struct DocsTests {
    static let repository = DashboardTests.repository

    /// The pages: the front page, the developers' page, every page under docs/, the kit's.
    static func pages() throws -> [URL] {
        let docs = repository.appendingPathComponent("docs")
        let names = try FileManager.default.contentsOfDirectory(atPath: docs.path).filter { $0.hasSuffix(".md") }.sorted()
        return [repository.appendingPathComponent("README.md"), repository.appendingPathComponent("DEVELOPERS.md"),
                repository.appendingPathComponent("Clients/AdTallyKit/README.md")] + names.map { docs.appendingPathComponent($0) }
    }

    @Test("every link of README.md, DEVELOPERS.md, docs/ and the kit's page leads to a file, and to a heading of it when it names one; every docs/ page is linked from README.md")
    func linksResolve() throws {
        var problems: [String] = []
        for page in try Self.pages() {
            let document = try Markdown(page)
            if document.unclosedFence { problems.append("\(page.lastPathComponent): a code fence is never closed") }
            for target in document.links where !target.contains("://") && !target.hasPrefix("mailto:") {
                let parts = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                let file = parts[0].isEmpty ? page : page.deletingLastPathComponent().appendingPathComponent(parts[0]).standardizedFileURL
                guard FileManager.default.fileExists(atPath: file.path) else {
                    problems.append("\(page.lastPathComponent): \(target): no such file")
                    continue
                }
                if parts.count == 2, file.pathExtension == "md", !(try Markdown(file).anchors.contains(parts[1])) {
                    problems.append("\(page.lastPathComponent): \(target): no heading \(parts[1]) in \(file.lastPathComponent)")
                }
            }
        }
        let readme = try Markdown(Self.repository.appendingPathComponent("README.md"))
        for page in try Self.pages() where page.deletingLastPathComponent().lastPathComponent == "docs" {
            if !readme.links.contains(where: { $0.split(separator: "#").first.map(String.init) == "docs/\(page.lastPathComponent)" }) {
                problems.append("README.md does not link docs/\(page.lastPathComponent)")
            }
        }
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
    }

    @Test("every adtally command and option, make target, HTTP route and repository file the pages show exists; adtally … --help parses each command")
    func commandsExist() async throws {
        let dump = try await runProcess([adtallyBinary(), "--experimental-dump-help"])
        #expect(dump.status == 0)
        let root = try CommandTree(dump: Data(dump.output.utf8))
        let targets = try Self.makeTargets()
        let routes = try Self.routes()
        var problems: [String] = []
        var commands = Set<[String]>()
        var shown = (commands: 0, targets: 0, routes: 0, files: 0)
        for page in try Self.pages() {
            let name = page.path.replacingOccurrences(of: Self.repository.path + "/", with: "")
            let document = try Markdown(page)
            for block in document.otherBlocks {
                for path in Self.filesShown(block) {
                    shown.files += 1
                    if !FileManager.default.fileExists(atPath: Self.repository.appendingPathComponent(path).path) {
                        problems.append("\(name): `\(path)` (in a text block): no such file or folder")
                    }
                }
            }
            for segment in document.code {
                // A shell block's lines are commands of their own; a `cd` leaves this repository's Makefile.
                var elsewhere = false
                for line in segment.isShell ? segment.text.components(separatedBy: "\n") : [segment.text] {
                    let words = line.split(whereSeparator: \.isWhitespace).map(String.init)
                    for (index, word) in words.enumerated() {
                        if word == "cd" { elsewhere = true }
                        if word == "adtally" || (word.hasSuffix("/adtally") && !word.contains("://")) {
                            // The command's words, up to the shell's next command in a block.
                            let rest = words[(index + 1)...].prefix { !(segment.isShell && ["|", "||", "&&", ";", ">", "#"].contains($0)) }
                            if !rest.isEmpty { shown.commands += 1 }
                            for problem in root.check(Array(rest), found: &commands) { problems.append("\(name): `\(segment.excerpt(word))`: \(problem)") }
                        } else if word == "make", !elsewhere {
                            for target in words[(index + 1)...].prefix(while: { $0.range(of: #"^[a-z][a-z0-9-]*$"#, options: .regularExpression) != nil }) {
                                shown.targets += 1
                                if !targets.contains(target) { problems.append("\(name): `make \(target)`: no such target in the Makefile") }
                            }
                        }
                    }
                }
                for path in Self.filesShown(segment.text) {
                    shown.files += 1
                    if !FileManager.default.fileExists(atPath: Self.repository.appendingPathComponent(path).path) {
                        problems.append("\(name): `\(path)`: no such file or folder")
                    }
                }
                for (method, path) in Self.routesShown(segment.text) {
                    shown.routes += 1
                    if !routes.contains(where: { $0.method == method && Self.matches(path, $0.path) }) {
                        problems.append("\(name): `\(method) \(path)`: not in openapi.yaml")
                    }
                }
            }
        }
        // The pages show many of each: a parser that found none would check nothing.
        #expect(shown.commands > 80 && shown.targets > 15 && shown.routes > 60 && shown.files > 30, "\(shown)")
        for command in commands.sorted(by: { $0.joined(separator: " ") < $1.joined(separator: " ") }) {
            let help = try await runProcess([adtallyBinary()] + command + ["--help"])
            if help.status != 0 || !help.output.contains("USAGE: adtally \(command.joined(separator: " "))") {
                problems.append("adtally \(command.joined(separator: " ")) --help: exit \(help.status): \(help.output.prefix(200))")
            }
        }
        #expect(commands.count > 40, "\(commands.count) commands")
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
    }

    @Test("what adtally demo says to try runs: each adtally command it prints (the export written by a running server), and its curl")
    func demoSuggestionsRun() async throws {
        try await TestDatabase.withDatabase { conninfo in
            // Inside the test servers' exports root (the temporary folder), as the demo's
            // folder must lie inside the root it is given.
            // A name that needs quoting, so that what the demo prints must quote it.
            let root = FileManager.default.temporaryDirectory.appendingPathComponent("adtally docs's \(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: root) }
            let database = ["--database-url", conninfo, "--exports-root", root]
            let demo = try await runProcess([adtallyBinary(), "demo", "--days", "2", "--scale", "0.05"] + database)
            #expect(demo.status == 0, "\(demo.output)")
            let lines = demo.output.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            // The commands name the binary as it was run (here its path), not an `adtally` the PATH may not have.
            let binary = adtallyBinary()
            #expect(!lines.contains { $0.hasPrefix("adtally ") }, "\(demo.output)")
            let suggested = lines.filter { $0.hasPrefix(binary + " ") || $0.hasPrefix("mkdir ") || $0.hasPrefix("curl ") }.map(Self.shellWords).map { words in
                words.first == binary ? ["adtally"] + words.dropFirst() : words
            }
            #expect(suggested.filter { $0.first == "adtally" }.count >= 7 && suggested.contains { $0.first == "curl" }, "\(demo.output)")
            try await withReadyServer(conninfo) { server, _ in
                for words in suggested {
                    let run: (status: Int32, output: String)
                    switch words[0] {
                    case "adtally": run = try await runProcess([adtallyBinary()] + words.dropFirst() + database)
                    case "curl": run = try await runProcess(["curl", "-sS", "--fail", "-o", "/dev/null"] + words.dropFirst().map {
                        $0.replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(server.port)")
                    })
                    default: run = try await runProcess(words)
                    }
                    #expect(run.status == 0, "\(words.joined(separator: " ")): \(run.output)")
                }
            }
            let written = try FileManager.default.contentsOfDirectory(atPath: root + "/finance/demo-daily")
            #expect(written.contains { $0.hasSuffix(".csv") } && written.contains { $0.hasSuffix(".manifest.json") }, "\(written)")
        }
    }

    // MARK: - Reading the pages

    /// A page's links (outside code) and code: fenced blocks (lines joined where they
    /// end in `\`) and inline spans (which may run over line breaks).
    struct Markdown {
        struct Code {
            var text: String
            /// A shell block, whose `|`, `&&` and `;` separate commands (in prose, `|` separates alternatives).
            var isShell: Bool
            func excerpt(_ from: String) -> String {
                let start = text.range(of: from)?.lowerBound ?? text.startIndex
                return String(text[start...].prefix(90)).replacingOccurrences(of: "\n", with: " ")
            }
        }

        var links: [String] = []
        var code: [Code] = []
        /// Paths named in other fenced blocks (`text`: trees and module graphs), checked as files only.
        var otherBlocks: [String] = []
        var headings: [String] = []
        /// A fence opened and never closed (the rest of the page would go unread).
        var unclosedFence = false

        init(_ url: URL) throws {
            let text = try String(contentsOf: url, encoding: .utf8)
            var prose: [String] = []
            var fence: (info: String, lines: [String])?
            for line in text.components(separatedBy: "\n") {
                let trimmed = line.trimmingCharacters(in: .whitespaces)
                if trimmed.hasPrefix("```") {
                    if let open = fence {
                        let shell = ["", "sh", "bash", "shell", "console"].contains(open.info)
                        if shell {
                            code.append(Code(text: open.lines.joined(separator: "\n").replacingOccurrences(of: "\\\n", with: " "), isShell: true))
                        } else if open.info == "text" {
                            otherBlocks.append(open.lines.joined(separator: "\n"))
                        }
                        fence = nil
                    } else {
                        fence = (String(trimmed.dropFirst(3)).trimmingCharacters(in: .whitespaces), [])
                    }
                    prose.append("")
                } else if fence != nil {
                    fence!.lines.append(line)
                } else {
                    prose.append(line)
                    if line.range(of: #"^#{1,6} "#, options: .regularExpression) != nil {
                        headings.append(line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces))
                    }
                }
            }
            unclosedFence = fence != nil
            // Paragraphs: inline spans may run over a line break, never over a blank line.
            for paragraph in prose.joined(separator: "\n").components(separatedBy: "\n\n") {
                let flat = paragraph.replacingOccurrences(of: "\n", with: " ")
                var outside = ""
                for (index, piece) in flat.components(separatedBy: "`").enumerated() {
                    if index % 2 == 1 { code.append(Code(text: piece, isShell: false)) } else { outside += piece + " " }
                }
                for match in Self.linkPattern.matches(in: outside, range: NSRange(outside.startIndex..., in: outside)) {
                    links.append(String(outside[Range(match.range(at: 1), in: outside)!]))
                }
            }
        }

        static let linkPattern = try! NSRegularExpression(pattern: #"\]\(([^)\s]+)\)"#)

        /// The headings' anchors as GitHub makes them: lower case, punctuation dropped,
        /// spaces as hyphens, a repeat numbered.
        var anchors: Set<String> {
            var seen: [String: Int] = [:]
            var result = Set<String>()
            for heading in headings {
                let slug = String(heading.lowercased().compactMap { character -> Character? in
                    if character == " " { return "-" }
                    return character.isLetter || character.isNumber || character == "-" || character == "_" ? character : nil
                })
                let count = seen[slug, default: 0]
                seen[slug] = count + 1
                result.insert(count == 0 ? slug : "\(slug)-\(count)")
            }
            return result
        }
    }

    /// The CLI's commands and their long options, from `--experimental-dump-help`.
    struct CommandTree {
        var name: String
        var options: Set<String>
        var subcommands: [String: CommandTree]

        init(dump: Data) throws {
            let json = try #require(try JSONSerialization.jsonObject(with: dump) as? [String: Any])
            self = try CommandTree(try #require(json["command"] as? [String: Any]))
        }

        init(_ command: [String: Any]) throws {
            name = command["commandName"] as? String ?? ""
            var options: Set<String> = ["help"]
            for argument in command["arguments"] as? [[String: Any]] ?? [] {
                for name in argument["names"] as? [[String: Any]] ?? [] where name["kind"] as? String == "long" {
                    if let text = name["name"] as? String { options.insert(text) }
                }
            }
            self.options = options
            var subcommands: [String: CommandTree] = [:]
            for sub in command["subcommands"] as? [[String: Any]] ?? [] {
                let tree = try CommandTree(sub)
                subcommands[tree.name] = tree
            }
            self.subcommands = subcommands
        }

        /// What is wrong with the words after `adtally` (none: nothing); each command
        /// reached is added to `found`. `a|b` names alternatives, each checked.
        func check(_ words: [String], path: [String] = [], found: inout Set<[String]>) -> [String] {
            // Brackets, parentheses and quotes around a word are notation; `…` and a lone `|` too.
            let cleaned = words.map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "[]()`,.;:'\"")) }.filter { !$0.isEmpty && $0 != "…" && $0 != "|" }
            if let first = cleaned.first, !subcommands.isEmpty, first.range(of: #"^[a-z][a-z-]*(\|[a-z][a-z-]*)*$"#, options: .regularExpression) != nil {
                var problems: [String] = []
                for alternative in first.split(separator: "|").map(String.init) {
                    guard let sub = subcommands[alternative] else {
                        problems.append("`\((["adtally"] + path).joined(separator: " "))` has no subcommand `\(alternative)`")
                        continue
                    }
                    problems += sub.check(Array(cleaned.dropFirst()), path: path + [alternative], found: &found)
                }
                return problems
            }
            if !path.isEmpty { found.insert(path) }
            return cleaned.filter { $0.hasPrefix("--") }.compactMap { word in
                let option = String(word.dropFirst(2).prefix { $0 != "=" })
                return options.contains(option) ? nil : "`adtally \(path.joined(separator: " "))` has no option `--\(option)`"
            }
        }
    }

    /// The Makefile's targets.
    static func makeTargets() throws -> Set<String> {
        let makefile = try String(contentsOf: repository.appendingPathComponent("Makefile"), encoding: .utf8)
        var targets = Set<String>()
        for line in makefile.split(separator: "\n") where line.first?.isLetter == true {
            guard let colon = line.firstIndex(of: ":"), !line[colon...].hasPrefix(":=") else { continue }
            targets.formUnion(line[..<colon].split(separator: " ").map(String.init))
        }
        return targets
    }

    /// The served document's paths and their methods.
    static func routes() throws -> [(method: String, path: String)] {
        let spec = try String(contentsOf: repository.appendingPathComponent("Sources/AdTallyHTTP/Resources/openapi.yaml"), encoding: .utf8)
        var routes: [(method: String, path: String)] = []
        var path: String?
        for line in spec.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("  /"), line.hasSuffix(":") {
                path = String(line.dropFirst(2).dropLast())
            } else if line.hasPrefix("  "), !line.hasPrefix("   ") {
                path = nil
            } else if let current = path, line.hasPrefix("    "), !line.hasPrefix("     ") {
                let key = line.trimmingCharacters(in: .whitespaces).dropLast()
                if ["get", "post", "put", "delete", "head", "patch"].contains(key) { routes.append((key.uppercased(), current)) }
            }
        }
        return routes
    }

    /// The routes a code span names: `GET /v1/reports`, `GET|POST /v1/alerts`,
    /// `POST /v1/exports/{name}/pause|resume|run`, and URLs of a local server (GET).
    static func routesShown(_ text: String) -> [(method: String, path: String)] {
        var shown: [(String, String)] = []
        let methods = "GET|POST|PUT|DELETE|HEAD|PATCH"
        let pattern = try! NSRegularExpression(pattern: #"\b((?:\#(methods))(?:[|/](?:\#(methods)))*) (/[A-Za-z0-9_{}./|-]*)"#)
        for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            let verbs = text[Range(match.range(at: 1), in: text)!].split(whereSeparator: { $0 == "|" || $0 == "/" }).map(String.init)
            let path = String(text[Range(match.range(at: 2), in: text)!]).trimmingCharacters(in: CharacterSet(charactersIn: "."))
            for verb in verbs { for expanded in expand(path) { shown.append((verb, expanded)) } }
        }
        let local = try! NSRegularExpression(pattern: #"http://127\.0\.0\.1:8080(/[A-Za-z0-9_{}./-]*)"#)
        for match in local.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            shown.append(("GET", String(text[Range(match.range(at: 1), in: text)!])))
        }
        return shown.filter { !$0.1.hasPrefix("/static/") && $0.1 != "/" }
    }

    /// The repository's files a code span names: `Migrations/0012_priced_rollups.sql`,
    /// `scripts/test-replica.sh`, or a module's `AdTallyStorage/Ingest/EventStore.swift`
    /// (under Sources/). A placeholder (`NNNN`, `*`, `…`) is not a file.
    /// What .gitignore names (plain paths) is made by a command, such as `make fuzz`'s
    /// `Fuzz/findings/`: a page may name it before it exists.
    static let generated = ((try? String(contentsOf: repository.appendingPathComponent(".gitignore"), encoding: .utf8)) ?? "")
        .split(separator: "\n").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "/ ")) }
        .filter { !$0.isEmpty && $0.contains("/") && !$0.contains("*") }

    static func filesShown(_ text: String) -> [String] {
        let pattern = try! NSRegularExpression(pattern: #"(?<![\w./-])((?:Sources|Tests|Migrations|Dashboards|deploy|scripts|bench|docs|Clients|Fuzz|AdTallyCore|AdTallyStorage|AdTallyHTTP|AdTallyApp|PostgresKit)/[A-Za-z0-9_./+-]*[A-Za-z0-9_/])"#)
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap { match in
            let path = String(text[Range(match.range(at: 1), in: text)!])
            if path.contains("NNNN") || path.contains("…") { return nil }
            if generated.contains(where: { path == $0 || path.hasPrefix($0 + "/") }) { return nil }
            return path.hasPrefix("AdTally") || path.hasPrefix("PostgresKit/") ? "Sources/" + path : path
        }
    }

    /// `/a/b|c` as `/a/b` and `/a/c`.
    static func expand(_ path: String) -> [String] {
        path.split(separator: "/").reduce([""]) { prefixes, segment in
            prefixes.flatMap { prefix in segment.split(separator: "|").map { prefix + "/" + $0 } }
        }
    }

    /// Whether a path shown matches a template of the document (`{…}` matches a segment).
    static func matches(_ shown: String, _ template: String) -> Bool {
        let a = shown.split(separator: "/"), b = template.split(separator: "/")
        return a.count == b.count && zip(a, b).allSatisfy { $0 == $1 || $0.hasPrefix("{") || $1.hasPrefix("{") }
    }

    /// A line split as a shell splits words (quotes and backslashes, no expansion).
    static func shellWords(_ line: String) -> [String] {
        var words: [String] = []
        var current = ""
        var quote: Character?
        var inWord = false
        var escaped = false
        for character in line {
            if escaped {
                if quote == "\"", "$`\"\\".contains(character) { current.removeLast() }
                current.append(character)
                escaped = false
            } else if let open = quote {
                if character == open {
                    quote = nil
                } else if character == "\\" && open == "\"" {
                    escaped = true
                    // In double quotes a backslash escapes only $ ` " \ (POSIX): before anything else it stays.
                    current.append("\\")
                } else {
                    current.append(character)
                }
            } else if character == "\\" {
                escaped = true
                inWord = true
            } else if character == "'" || character == "\"" {
                quote = character
                inWord = true
            } else if character.isWhitespace {
                if inWord { words.append(current) }
                current = ""
                inWord = false
            } else {
                current.append(character)
                inWord = true
            }
        }
        if inWord { words.append(current) }
        return words
    }
}

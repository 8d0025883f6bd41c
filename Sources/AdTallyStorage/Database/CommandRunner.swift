import Foundation

/// Runs an external program to completion and captures its output.
///
/// Uses posix_spawn and waitpid directly: Foundation's `Process` waits for its own
/// pipes to close, which never happens when the program leaves a daemon behind
/// (as `pg_ctl start` does).
struct CommandRunner {
    struct Outcome {
        var status: Int32
        var output: String
    }

    /// Runs `executable` with `arguments`; when `asUser` is set (we are root), through `runuser`.
    static func run(_ executable: String, _ arguments: [String], asUser: String? = nil) throws -> Outcome {
        let argv = asUser.map { [runuserPath, "-u", $0, "--", executable] + arguments } ?? [executable] + arguments
        let capture = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-cmd-\(UUID().uuidString).out")
        defer { try? FileManager.default.removeItem(at: capture) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, capture.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)

        let cArguments = argv.map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, argv[0], &actions, nil, cArguments, environ)
        guard spawned == 0 else {
            throw CommandError(command: argv[0], reason: String(cString: strerror(spawned)))
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 {
            guard errno == EINTR else { throw CommandError(command: argv[0], reason: String(cString: strerror(errno))) }
        }
        let output = (try? String(contentsOf: capture, encoding: .utf8)) ?? ""
        // WIFEXITED / WEXITSTATUS, which Swift does not import as macros.
        let exitCode: Int32 = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        return Outcome(status: exitCode, output: output.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    static var runuserPath: String {
        ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"].first { FileManager.default.isExecutableFile(atPath: $0) }
            ?? "/usr/sbin/runuser"
    }
}

/// A program that could not be run.
struct CommandError: Error, CustomStringConvertible {
    var command: String
    var reason: String
    var description: String { "could not run \(command): \(reason)" }
}

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// What the kit's executables (the example, the kill test's child, the bench) share.

/// The value after `--name` on the command line, if any.
public func option(_ name: String) -> String? {
    let arguments = CommandLine.arguments
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}

/// Writes a whole line to standard output at once, unbuffered (a kill cannot leave it in a buffer).
public func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress!, $0.count) }
}

/// Runs async work to its end from top-level code; a failure ends the process.
public func waitFor(_ body: @escaping @Sendable () async throws -> Void) {
    let done = DispatchSemaphore(value: 0)
    Task.detached {
        do {
            try await body()
        } catch {
            say("failed: \(error)")
            exit(1)
        }
        done.signal()
    }
    done.wait()
}

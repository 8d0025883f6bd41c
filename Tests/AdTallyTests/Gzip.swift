import Foundation

/// Gzips bytes with the system's gzip, as a mobile SDK would before sending.
func gzip(_ bytes: [UInt8]) throws -> [UInt8] {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-gzip-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: folder) }
    let input = folder.appendingPathComponent("body")
    try Data(bytes).write(to: input)
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/gzip")
    process.arguments = ["-9", input.path]
    try process.run()
    process.waitUntilExit()
    return Array(try Data(contentsOf: folder.appendingPathComponent("body.gz")))
}

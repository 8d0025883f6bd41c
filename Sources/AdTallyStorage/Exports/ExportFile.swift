import AdTallyCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A file or folder an export cannot write: names the path and the system's reason.
public struct ExportFileError: Error, Sendable, CustomStringConvertible {
    /// The path.
    public var path: String
    /// What failed, with strerror's words.
    public var reason: String

    init(_ path: String, _ action: String, errno code: Int32 = errno) {
        self.path = path
        self.reason = "\(action): \(String(cString: strerror(code)))"
    }

    public var description: String { "cannot write \(path): \(reason)" }
}

/// An export file written the safe way: under a hidden temporary name beside its
/// final one, fsynced, then renamed over it (with its manifest) and the folder
/// fsynced — a reader never sees a partial file under the final name, and a crash
/// leaves at most a `.NAME.tmp-…` file that the slot's next attempt removes.
/// The bytes are counted and hashed as they are written.
///
/// `@unchecked Sendable`: one export run owns a file and uses it from one task at a
/// time — its writes in the run's task, its commit in a pool thread the run awaits.
public final class ExportFile: @unchecked Sendable {
    /// The final path.
    public let path: String
    let temporaryPath: String
    private var descriptor: Int32
    private var hasher = SHA256()
    private var isCommitted = false
    /// Bytes written.
    public private(set) var bytes: Int64 = 0

    /// Folder and file name of a path.
    static func split(_ path: String) -> (folder: String, name: String) {
        let url = URL(fileURLWithPath: path)
        return (url.deletingLastPathComponent().path, url.lastPathComponent)
    }

    /// Prefix of the temporary names of `name` (all attempts).
    static func temporaryPrefix(_ name: String) -> String { ".\(name).tmp-" }

    /// Creates the folder if needed, removes temporary files an earlier attempt left
    /// for this file, and opens a new temporary one.
    public init(path: String) throws {
        self.path = path
        let (folder, name) = Self.split(path)
        try Self.makeFolder(folder)
        for leftover in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [] where leftover.hasPrefix(Self.temporaryPrefix(name)) {
            unlink(folder + "/" + leftover)
        }
        temporaryPath = "\(folder)/\(Self.temporaryPrefix(name))\(getpid())-\(UInt32.random(in: .min ... .max))"
        descriptor = open(temporaryPath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw ExportFileError(temporaryPath, "open") }
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
        if !isCommitted { unlink(temporaryPath) }
    }

    /// Appends bytes.
    public func write(_ data: [UInt8]) throws {
        try Self.writeAll(descriptor, data, path: temporaryPath)
        hasher.update(data)
        bytes += Int64(data.count)
    }

    /// Flushes the file to disk and returns its SHA-256 (hex); `commit` renames it.
    public func finish() throws -> String {
        guard fsync(descriptor) == 0 else { throw ExportFileError(temporaryPath, "fsync") }
        guard close(descriptor) == 0 else { throw ExportFileError(temporaryPath, "close") }
        descriptor = -1
        return hasher.finalize().hexString
    }

    /// Puts the finished file under its final name, then the manifest beside it
    /// (`PATH.manifest.json`, written the same way): a manifest never names a file
    /// that is not whole. Both renames replace what an interrupted attempt may have left.
    public func commit(manifest: [UInt8]) throws {
        let manifestPath = path + ".manifest.json"
        // An earlier attempt that renamed its files but could not record the run may have
        // left a manifest: it goes first, so no manifest ever describes other bytes.
        if unlink(manifestPath) == 0 {
            // On disk before the data rename, or a crash could keep the rename and not this.
            try Self.syncFolder(Self.split(path).folder)
        } else if errno != ENOENT {
            throw ExportFileError(manifestPath, "unlink")
        }
        let manifestTemporary = "\(temporaryPath).manifest"
        let handle = open(manifestTemporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard handle >= 0 else { throw ExportFileError(manifestTemporary, "open") }
        do {
            try Self.writeAll(handle, manifest, path: manifestTemporary)
            guard fsync(handle) == 0 else { throw ExportFileError(manifestTemporary, "fsync") }
        } catch {
            close(handle)
            unlink(manifestTemporary)
            throw error
        }
        close(handle)
        guard rename(temporaryPath, path) == 0 else {
            let error = ExportFileError(path, "rename")
            unlink(manifestTemporary)
            throw error
        }
        isCommitted = true
        guard rename(manifestTemporary, manifestPath) == 0 else { throw ExportFileError(manifestPath, "rename") }
        try Self.syncFolder(Self.split(path).folder)
    }

    static func writeAll(_ descriptor: Int32, _ data: [UInt8], path: String) throws {
        var offset = 0
        while offset < data.count {
            let written = data[offset...].withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                throw ExportFileError(path, "write")
            }
            offset += written
        }
    }

    /// Makes the schedule's folder inside the destination directory, which must exist:
    /// a shared mount that is missing on this server fails the run rather than filling
    /// the mount point on the local disk. A symlink in its place is refused (it could
    /// lead out of the exports root).
    static func makeFolder(_ folder: String) throws {
        if mkdir(folder, 0o755) != 0, errno != EEXIST {
            let code = errno
            throw ExportFileError(folder, code == ENOENT ? "mkdir (the destination directory does not exist)" : "mkdir", errno: code)
        }
        var status = stat()
        guard lstat(folder, &status) == 0 else { throw ExportFileError(folder, "stat") }
        guard status.st_mode & S_IFMT != S_IFLNK else { throw ExportFileError(folder, "mkdir (a symbolic link stands where the schedule's folder goes)", errno: ELOOP) }
        guard status.st_mode & S_IFMT == S_IFDIR else { throw ExportFileError(folder, "mkdir", errno: ENOTDIR) }
    }

    /// `directory` with every symlink and `..` resolved, when it lies inside `root` (also
    /// resolved): where an export may be written. Checked when a schedule is made and
    /// again before every run, so a folder swapped for a symlink later is caught too.
    public static func resolve(directory: String, root: String) throws(ExportScheduleError) -> String {
        guard let realRoot = realPath(root) else {
            throw ExportScheduleError("dir", "the exports root \(root) cannot be used (\(String(cString: strerror(errno)))); set --exports-root or ADTALLY_EXPORTS_ROOT to an existing folder")
        }
        guard let real = realPath(directory) else {
            throw ExportScheduleError("dir", "\(directory) cannot be used (\(String(cString: strerror(errno)))); the directory must exist inside the exports root \(realRoot)")
        }
        guard realRoot == "/" || real == realRoot || real.hasPrefix(realRoot + "/") else {
            throw ExportScheduleError("dir", "\(directory) is outside the exports root \(realRoot) (symbolic links and .. resolved); exports are written only inside it (--exports-root, ADTALLY_EXPORTS_ROOT)")
        }
        return real
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    static func syncFolder(_ folder: String) throws {
        let handle = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard handle >= 0 else { throw ExportFileError(folder, "open") }
        defer { close(handle) }
        guard fsync(handle) == 0 else { throw ExportFileError(folder, "fsync") }
    }

    /// Checks that `directory` exists and can be written here: writes, fsyncs and removes
    /// a probe file. Refusing at creation beats a failed run at 06:00. It runs as the
    /// user that creates the schedule, on that machine: the servers may still differ.
    public static func checkWritable(directory: String, schedule: String) throws(ExportScheduleError) {
        var status = stat()
        guard stat(directory, &status) == 0 else {
            throw ExportScheduleError("dir", "\(directory) cannot be used (\(String(cString: strerror(errno)))); the directory must exist")
        }
        guard status.st_mode & S_IFMT == S_IFDIR else { throw ExportScheduleError("dir", "\(directory) is not a directory") }
        // A probe in the directory itself: the schedule's folder is left for the server to
        // make, as the user it runs as.
        do {
            let probe = try ExportFile(path: directory + "/.adtally-probe-" + schedule)
            try probe.write(Array("probe\n".utf8))
            _ = try probe.finish()
        } catch let error as ExportFileError {
            throw ExportScheduleError("dir", "\(error.path) is not writable (\(error.reason))")
        } catch {
            throw ExportScheduleError("dir", "\(directory) is not writable (\(error))")
        }
    }
}

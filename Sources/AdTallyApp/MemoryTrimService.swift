#if canImport(Glibc)
import Glibc
#endif
import ServiceLifecycle
import Synchronization

/// Gives memory freed after a peak back to the system.
///
/// glibc's allocator keeps what a burst freed (a large CSV, an FX import, many bodies
/// at once) in its arenas, one per thread that allocated, and returns only the top of
/// the main heap by itself: after such a burst the idle server stayed at 1.7 GB where it
/// had started at 54 MB. `malloc_trim(0)` releases the free pages of every arena; it
/// walks only free chunks, so it runs on a timer rather than being wired into each path
/// that can make a peak (its cost was not measured apart from the suite's time).
struct MemoryTrimService: Service {
    var interval: Duration = .seconds(5)

    /// When this process last trimmed: the heap is the process's, so one trim per
    /// interval serves every server in it (tests run dozens).
    private static let lastTrim = Mutex<ContinuousClock.Instant?>(nil)

    /// Trims unless another service of this process did within most of `interval`.
    static func trimOnce(per interval: Duration) {
        let now = ContinuousClock.now
        let due = lastTrim.withLock { last in
            guard last.map({ now - $0 >= interval * 0.9 }) ?? true else { return false }
            last = now
            return true
        }
        if due { _ = trim?(0) }
    }

    /// glibc's `malloc_trim`, which its Swift module does not export (it is in
    /// `<malloc.h>`); nil on a C library without it.
    static let trim: (@convention(c) (Int) -> Int32)? = {
        #if canImport(Glibc)
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "malloc_trim") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)
        #else
        return nil
        #endif
    }()

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                Self.trimOnce(per: interval)
            }
        }
    }
}

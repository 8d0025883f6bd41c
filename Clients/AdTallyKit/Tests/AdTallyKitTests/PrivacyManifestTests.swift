import Foundation
import XCTest

/// The kit's privacy manifest (Sources/AdTallyKit/PrivacyInfo.xcprivacy) declares every
/// category of Apple's required-reason APIs that the kit's library sources call: App
/// Store Connect refuses an app whose SDK calls one undeclared (ITMS-91053).
final class PrivacyManifestTests: XCTestCase {
    /// Each category, with the calls of it that a Swift source could make.
    static let categories: [String: [String]] = [
        "NSPrivacyAccessedAPICategoryFileTimestamp": [
            "stat(", "fstat(", "lstat(", "fstatat(", "getattrlist(", "getattrlistbulk(", "fgetattrlist(", "getattrlistat(",
            "attributesOfItem(", "creationDate", "modificationDate", ".contentModificationDateKey", ".creationDateKey",
        ],
        "NSPrivacyAccessedAPICategorySystemBootTime": ["systemUptime", "mach_absolute_time(", "DispatchTime.now("],
        "NSPrivacyAccessedAPICategoryDiskSpace": [
            "volumeAvailableCapacity", "volumeTotalCapacity", ".systemFreeSize", ".systemSize", "statfs(", "statvfs(", "fstatfs(", "fstatvfs(",
        ],
        "NSPrivacyAccessedAPICategoryUserDefaults": ["UserDefaults"],
    ]

    static var sources: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources/AdTallyKit")
    }

    func declared() throws -> [String: [String]] {
        let data = try Data(contentsOf: Self.sources.appendingPathComponent("PrivacyInfo.xcprivacy"))
        let plist = try XCTUnwrap(try PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any])
        XCTAssertEqual(plist["NSPrivacyTracking"] as? Bool, false)
        var declared: [String: [String]] = [:]
        for entry in try XCTUnwrap(plist["NSPrivacyAccessedAPITypes"] as? [[String: Any]]) {
            let category = try XCTUnwrap(entry["NSPrivacyAccessedAPIType"] as? String)
            declared[category] = try XCTUnwrap(entry["NSPrivacyAccessedAPITypeReasons"] as? [String])
        }
        return declared
    }

    func testEveryRequiredReasonAPIThatTheKitCallsIsDeclaredWithAReason() throws {
        let declared = try declared()
        var used: [String: String] = [:]
        let files = try FileManager.default.contentsOfDirectory(atPath: Self.sources.path).filter { $0.hasSuffix(".swift") }
        XCTAssertFalse(files.isEmpty)
        for file in files {
            let code = try String(contentsOf: Self.sources.appendingPathComponent(file), encoding: .utf8)
                .split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("//") }.joined(separator: "\n")
            for (category, calls) in Self.categories {
                for call in calls where code.contains(call) { used[category] = "\(file): \(call)" }
            }
        }
        XCTAssertNotNil(used["NSPrivacyAccessedAPICategoryFileTimestamp"], "the scan finds the kit's fstat")
        for (category, example) in used {
            XCTAssertFalse(declared[category]?.isEmpty ?? true, "\(category) is called (\(example)) but not declared with a reason")
        }
    }

    func testTheManifestShipsInsideTheTargetsFolderAsAResource() throws {
        let manifest = try String(contentsOf: Self.sources.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Package.swift"), encoding: .utf8)
        XCTAssertTrue(manifest.contains(#"resources: [.copy("PrivacyInfo.xcprivacy")]"#))
        XCTAssertEqual(try declared()["NSPrivacyAccessedAPICategoryFileTimestamp"], ["C617.1"])
    }
}

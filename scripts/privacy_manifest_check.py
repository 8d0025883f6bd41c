#!/usr/bin/env python3
"""AdTallyKit's privacy manifest against the kit's own sources (DESIGN §15).

App Store Connect refuses an app whose SDK calls one of Apple's "required reason" APIs
without declaring its category and an approved reason in the SDK's own
PrivacyInfo.xcprivacy (ITMS-91053), and a manifest outside the target's folder, or not
declared as a resource of the target, never reaches the app. This script fails when:

- the manifest does not parse (plistlib), tracks, names tracking domains, or lacks the
  data the kit collects (device ID, product interaction, advertising data: analytics,
  not linked, not tracking);
- a required-reason API symbol from Apple's list appears in the kit's library sources
  (comments aside) and its category is not declared, or declared with a reason Apple
  does not list for it; or a category is declared that no source calls;
- Package.swift does not declare the file as a resource of the AdTallyKit target.

  scripts/privacy_manifest_check.py [KIT_DIR]      (default: Clients/AdTallyKit)
  scripts/privacy_manifest_check.py --self-test    (the checks fail where they must)
"""
import os
import plistlib
import re
import shutil
import sys
import tempfile

# Apple's list ("Describing use of required reason API"): each category, the symbols a
# Swift source may call it by, and the approved reasons.
CATEGORIES = {
    "NSPrivacyAccessedAPICategoryFileTimestamp": {
        "symbols": [r"\bstat\s*\(", r"\bfstat\s*\(", r"\blstat\s*\(", r"\bfstatat\s*\(", r"\bgetattrlist\s*\(", r"\bgetattrlistbulk\s*\(",
                    r"\bfgetattrlist\s*\(", r"\bgetattrlistat\s*\(", r"\battributesOfItem\s*\(", r"\bcreationDate\b", r"\bmodificationDate\b",
                    r"\bfileModificationDate\b", r"\bcontentModificationDateKey\b", r"\bcreationDateKey\b"],
        "reasons": {"DDA9.1", "C617.1", "3B52.1", "0A2A.1"},
    },
    "NSPrivacyAccessedAPICategorySystemBootTime": {
        "symbols": [r"\bsystemUptime\b", r"\bmach_absolute_time\s*\("],
        "reasons": {"35F9.1", "8FFB.1", "3D61.1"},
    },
    "NSPrivacyAccessedAPICategoryDiskSpace": {
        "symbols": [r"\bvolumeAvailableCapacity\w*", r"\bvolumeTotalCapacity\w*", r"\bsystemFreeSize\b", r"\bsystemSize\b",
                    r"\bstatfs\s*\(", r"\bstatvfs\s*\(", r"\bfstatfs\s*\(", r"\bfstatvfs\s*\("],
        "reasons": {"85F4.1", "E174.1", "7D9E.1", "B728.1"},
    },
    "NSPrivacyAccessedAPICategoryActiveKeyboards": {
        "symbols": [r"\bactiveInputModes\b"],
        "reasons": {"3EC4.1", "54BD.1"},
    },
    "NSPrivacyAccessedAPICategoryUserDefaults": {
        "symbols": [r"\bUserDefaults\b", r"\bNSUserDefaults\b"],
        "reasons": {"CA92.1", "1C8F.1", "C56D.1", "AC6B.1"},
    },
}

COLLECTED = ["NSPrivacyCollectedDataTypeDeviceID", "NSPrivacyCollectedDataTypeProductInteraction", "NSPrivacyCollectedDataTypeAdvertisingData"]


def code_of(text):
    """Swift source as the compiler reads it, less comments and string literals' text:
    `//` and nested `/* */` comments removed, string literals (plain, multi-line, raw)
    emptied but the code of their interpolations `\\( … )` kept, so that neither a
    commented-out call nor a URL's `//` or a glob's `/*` inside a string hides or
    invents one."""
    out = []
    scan_code(text, 0, out, interpolation=False)
    return "".join(out)


def scan_code(text, i, out, interpolation):
    """Code from i; in an interpolation, up to its closing parenthesis (returns after it)."""
    n, depth = len(text), 0
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            level, i = 1, i + 2
            while i < n and level:
                if text.startswith("/*", i):
                    level, i = level + 1, i + 2
                elif text.startswith("*/", i):
                    level, i = level - 1, i + 2
                else:
                    i += 1
        elif text[i] == '"' or (text[i] == "#" and re.match(r'#+"', text[i:])):
            i = scan_string(text, i, out)
        elif interpolation and text[i] == "(":
            depth += 1
            out.append("(")
            i += 1
        elif interpolation and text[i] == ")":
            if depth == 0:
                return i + 1
            depth -= 1
            out.append(")")
            i += 1
        else:
            out.append(text[i])
            i += 1
    return i


def scan_string(text, i, out):
    """A string literal from i (its opening hashes or quote); returns the index after it.
    Its text is left out, its interpolations' code kept (between spaces)."""
    n = len(text)
    hashes = len(re.match(r"#*", text[i:]).group(0))
    i += hashes
    quote = '"""' if text.startswith('"""', i) else '"'
    closing = quote + "#" * hashes
    escape = "\\" + "#" * hashes
    i += len(quote)
    out.append('"')
    while i < n and not text.startswith(closing, i):
        if text.startswith(escape + "(", i):
            out.append(" ")
            i = scan_code(text, i + len(escape) + 1, out, interpolation=True)
            out.append(" ")
        elif text.startswith(escape, i):
            i += len(escape) + 1
        else:
            i += 1
    out.append('"')
    return i + len(closing)


def check(kit):
    problems = []
    sources = os.path.join(kit, "Sources", "AdTallyKit")
    manifest_path = os.path.join(sources, "PrivacyInfo.xcprivacy")
    try:
        with open(manifest_path, "rb") as handle:
            manifest = plistlib.load(handle)
    except Exception as error:  # noqa: BLE001 - any parse failure is the finding
        return [f"{manifest_path}: does not parse as a property list ({error})"]
    if manifest.get("NSPrivacyTracking") is not False:
        problems.append("NSPrivacyTracking must be false: the kit does not track")
    if manifest.get("NSPrivacyTrackingDomains") != []:
        problems.append("NSPrivacyTrackingDomains must be an empty list")
    collected = {entry.get("NSPrivacyCollectedDataType"): entry for entry in manifest.get("NSPrivacyCollectedDataTypes", [])}
    for kind in COLLECTED:
        entry = collected.get(kind)
        if entry is None:
            problems.append(f"NSPrivacyCollectedDataTypes: {kind} is not declared")
        elif entry.get("NSPrivacyCollectedDataTypeLinked") is not False or entry.get("NSPrivacyCollectedDataTypeTracking") is not False \
                or entry.get("NSPrivacyCollectedDataTypePurposes") != ["NSPrivacyCollectedDataTypePurposeAnalytics"]:
            problems.append(f"NSPrivacyCollectedDataTypes: {kind} must be not linked, not tracking, for analytics only")
    declared = {}
    for entry in manifest.get("NSPrivacyAccessedAPITypes", []):
        declared[entry.get("NSPrivacyAccessedAPIType")] = entry.get("NSPrivacyAccessedAPITypeReasons", [])

    used = {}
    # Every Swift file of the target, subfolders included (SwiftPM builds them all).
    files = sorted(os.path.relpath(os.path.join(folder, name), sources)
                   for folder, _, names in os.walk(sources) for name in names if name.endswith(".swift"))
    if not files:
        problems.append(f"{sources}: no Swift sources to scan")
    for name in files:
        with open(os.path.join(sources, name), encoding="utf-8") as handle:
            code = code_of(handle.read())
        for category, spec in CATEGORIES.items():
            for pattern in spec["symbols"]:
                match = re.search(pattern, code)
                if match:
                    used.setdefault(category, f"{name}: {match.group(0).strip()}")
    for category, example in sorted(used.items()):
        reasons = declared.get(category)
        if not reasons:
            problems.append(f"{category} is called ({example}) but not declared in NSPrivacyAccessedAPITypes")
        else:
            wrong = [reason for reason in reasons if reason not in CATEGORIES[category]["reasons"]]
            if wrong:
                problems.append(f"{category}: reasons {wrong} are not among Apple's for it ({sorted(CATEGORIES[category]['reasons'])})")
    for category in sorted(set(declared) - set(used)):
        if category not in CATEGORIES:
            problems.append(f"{category}: not a required-reason category")
        else:
            problems.append(f"{category} is declared but no source of the kit calls it: the manifest must say what the kit does")

    with open(os.path.join(kit, "Package.swift"), encoding="utf-8") as handle:
        # Comments out (a commented-out resource is none); the resource's name is a string, kept.
        package = re.sub(r"/\*.*?\*/", "", handle.read(), flags=re.S)
        package = "\n".join(line.split("//", 1)[0] for line in package.splitlines())
    target = re.search(r'\.target\(\s*name:\s*"AdTallyKit".*?\n\s*\)', package, flags=re.S)
    if not target or 'resources: [.copy("PrivacyInfo.xcprivacy")]' not in target.group(0):
        problems.append('Package.swift: the AdTallyKit target must declare resources: [.copy("PrivacyInfo.xcprivacy")] (a manifest outside the target never reaches the app)')
    return problems


def self_test(kit):
    """Each kind of fault, made in a copy of the kit, must be found."""
    faults = {
        "an undeclared call": ("Sources/AdTallyKit/Gzip.swift", lambda text: text + "\nlet bootedAt = ProcessInfo.processInfo.systemUptime\n",
                               "NSPrivacyAccessedAPICategorySystemBootTime is called"),
        "the resource dropped": ("Package.swift", lambda text: text.replace('resources: [.copy("PrivacyInfo.xcprivacy")]', "resources: []"),
                                 "must declare resources"),
        "tracking": ("Sources/AdTallyKit/PrivacyInfo.xcprivacy",
                     lambda text: text.replace("<key>NSPrivacyTracking</key>\n\t<false/>", "<key>NSPrivacyTracking</key>\n\t<true/>"),
                     "NSPrivacyTracking must be false"),
        "a wrong reason": ("Sources/AdTallyKit/PrivacyInfo.xcprivacy", lambda text: text.replace("<string>C617.1</string>", "<string>35F9.1</string>"),
                           "not among Apple's"),
        "a call after a URL's // in a string": ("Sources/AdTallyKit/Gzip.swift",
                                                lambda text: text + '\nlet home = URL(string: "https://x")!; let free = statfs("/", nil)\n',
                                                "NSPrivacyAccessedAPICategoryDiskSpace is called"),
        "a call after an interpolation with a URL in it": ("Sources/AdTallyKit/Gzip.swift",
                                                           lambda text: text + '\nlet note = "at \\(URL(string: "https://x")!)"; let up = mach_absolute_time()\n',
                                                           "NSPrivacyAccessedAPICategorySystemBootTime is called"),
        "a call in an interpolation": ("Sources/AdTallyKit/Gzip.swift",
                                       lambda text: text + '\nlet note = "free \\(String(describing: try? URL(fileURLWithPath: "/").resourceValues(forKeys: [.volumeAvailableCapacityKey])))"\n',
                                       "NSPrivacyAccessedAPICategoryDiskSpace is called"),
        "a call in a subfolder": ("Sources/AdTallyKit/Gzip.swift", lambda text: text,  # the file is written below
                                  "NSPrivacyAccessedAPICategoryUserDefaults is called"),
        "a commented-out resource": ("Package.swift", lambda text: text.replace('resources: [.copy("PrivacyInfo.xcprivacy")]',
                                                                                'resources: [] // resources: [.copy("PrivacyInfo.xcprivacy")]'),
                                     "must declare resources"),
    }
    failures = []
    for name, (path, change, expected) in faults.items():
        with tempfile.TemporaryDirectory() as folder:
            copy = os.path.join(folder, "kit")
            shutil.copytree(kit, copy, ignore=shutil.ignore_patterns(".build", ".swiftpm"))
            target = os.path.join(copy, path)
            with open(target, encoding="utf-8") as handle:
                text = handle.read()
            changed = change(text)
            if name == "a call in a subfolder":
                os.makedirs(os.path.join(copy, "Sources/AdTallyKit/Extras"))
                with open(os.path.join(copy, "Sources/AdTallyKit/Extras/Settings.swift"), "w", encoding="utf-8") as handle:
                    handle.write("import Foundation\nlet stored = UserDefaults.standard.bool(forKey: \"x\")\n")
            elif changed == text:
                failures.append(f"{name}: the fault could not be made in {path}")
                continue
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(changed)
            found = check(copy)
            if not any(expected in problem for problem in found):
                failures.append(f"{name}: not found (expected '{expected}', got {found})")
    return failures


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    kit = os.path.join(here, "..", "Clients", "AdTallyKit")
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        failures = self_test(kit)
        for failure in failures:
            print(f"privacy manifest self-test: {failure}", file=sys.stderr)
        if failures:
            sys.exit(1)
        print("privacy manifest self-test: every fault found")
        return
    if len(sys.argv) > 1:
        kit = sys.argv[1]
    problems = check(kit)
    for problem in problems:
        print(f"privacy manifest: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("privacy manifest: PrivacyInfo.xcprivacy declares what the kit's sources call and collect")


if __name__ == "__main__":
    main()

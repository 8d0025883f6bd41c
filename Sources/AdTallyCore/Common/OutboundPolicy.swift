#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An IPv4 or IPv6 address, as its bytes (4 or 16).
public struct IPAddress: Sendable, Hashable, CustomStringConvertible {
    public let bytes: [UInt8]

    public init?(_ text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            bytes = withUnsafeBytes(of: &v4) { Array($0) }
            return
        }
        var v6 = in6_addr()
        // A zone (fe80::1%eth0) is not part of the address.
        let bare = text.split(separator: "%", maxSplits: 1).first.map(String.init) ?? text
        guard inet_pton(AF_INET6, bare, &v6) == 1 else { return nil }
        bytes = withUnsafeBytes(of: &v6) { Array($0) }
    }

    public init(bytes: [UInt8]) { self.bytes = bytes }

    public var isIPv4: Bool { bytes.count == 4 }

    /// The IPv4 address an IPv6 one carries (mapped `::ffff:a.b.c.d`, compatible
    /// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`), which is where a packet to it goes.
    public var embeddedIPv4: IPAddress? {
        guard bytes.count == 16 else { return nil }
        let head = Array(bytes[0..<12])
        let zeros = [UInt8](repeating: 0, count: 12)
        let mapped = [UInt8](repeating: 0, count: 10) + [0xFF, 0xFF]
        let nat64: [UInt8] = [0x00, 0x64, 0xFF, 0x9B] + [UInt8](repeating: 0, count: 8)
        // Compatible (`::a.b.c.d`, deprecated) but not `::` or `::1`, which are IPv6's own.
        let compatible = head == zeros && bytes[12..<15].contains { $0 != 0 }
        guard head == mapped || head == nat64 || compatible else { return nil }
        return IPAddress(bytes: Array(bytes[12..<16]))
    }

    public var description: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        var copy = bytes
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        guard inet_ntop(family, &copy, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// A range of addresses, `address/prefix`.
public struct IPNetwork: Sendable, Hashable, CustomStringConvertible {
    public let address: IPAddress
    public let prefix: Int

    /// `10.0.0.0/8`, `fd00::/8`, or one address (a prefix of all its bits).
    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = IPAddress(String(parts[0])) else { return nil }
        let bits = address.bytes.count * 8
        if parts.count == 2 {
            guard let prefix = Int(parts[1]), (0...bits).contains(prefix) else { return nil }
            self.prefix = prefix
        } else {
            prefix = bits
        }
        self.address = address
    }

    public func contains(_ other: IPAddress) -> Bool {
        guard other.bytes.count == address.bytes.count else { return false }
        var left = prefix
        for index in address.bytes.indices where left > 0 {
            let take = min(8, left)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - take))
            if address.bytes[index] & mask != other.bytes[index] & mask { return false }
            left -= take
        }
        return true
    }

    public var description: String { "\(address)/\(prefix)" }
}

/// Where AdTally's own requests (alert webhooks, network pulls and their token
/// endpoints) may go. By default nowhere inside: not loopback, link-local (where the
/// cloud metadata address 169.254.169.254 is), private, shared, multicast or reserved
/// ranges, in IPv4 or IPv6 (an IPv6 address carrying an IPv4 one is judged by that
/// one). `ADTALLY_OUTBOUND_ALLOW` lists what an operator allows anyway: CIDRs, single
/// addresses, or host names (exact, or `*.example.com` for its subdomains).
///
/// A destination is judged by every address its name resolves to, at the time of the
/// request; the request then goes to the address judged (never resolved again), so an
/// answer that changes between the check and the connection cannot move it.
public struct OutboundPolicy: Sendable, Equatable {
    public private(set) var networks: [IPNetwork] = []
    public private(set) var hosts: [String] = []

    public static let defaultPolicy = OutboundPolicy()

    public init() {}

    /// Parses `ADTALLY_OUTBOUND_ALLOW`: entries separated by commas or spaces.
    public init(allowing text: String, field: String = "ADTALLY_OUTBOUND_ALLOW") throws(FieldError) {
        for entry in text.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\n" || $0 == "\t" }).map(String.init) {
            if let network = IPNetwork(entry) {
                networks.append(network)
            } else if Self.isHostPattern(entry) {
                hosts.append(entry.lowercased())
            } else {
                throw FieldError(field, "\"\(entry.prefix(100))\" is neither a CIDR (10.0.0.0/8, fd00::/8), an address, nor a host name (hooks.example.com, *.example.com)")
            }
        }
    }

    static func isHostPattern(_ text: String) -> Bool {
        let name = text.hasPrefix("*.") ? String(text.dropFirst(2)) : text
        guard !name.isEmpty, name.utf8.count <= 253 else { return false }
        return name.split(separator: ".", omittingEmptySubsequences: false).allSatisfy { label in
            !label.isEmpty && label.utf8.count <= 63 && label.utf8.allSatisfy { byte in
                (0x61...0x7A).contains(byte | 0x20) || (0x30...0x39).contains(byte) || byte == 0x2D || byte == 0x5F
            }
        }
    }

    /// Whether the operator allowed this host by name.
    public func allows(host: String) -> Bool {
        let host = host.lowercased()
        return hosts.contains { $0 == host || ($0.hasPrefix("*.") && host.hasSuffix($0.dropFirst(1)) && host.count > $0.count - 1) }
    }

    /// The ranges refused by default, each with the name an error gives it.
    static let refused: [(IPNetwork, String)] = [
        ("0.0.0.0/8", "\"this network\""), ("10.0.0.0/8", "private"), ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local, where cloud metadata services answer"), ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved for protocol assignments"), ("192.168.0.0/16", "private"), ("198.18.0.0/15", "reserved for benchmarks"),
        ("224.0.0.0/4", "multicast"), ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"), ("::1/128", "loopback"), ("fc00::/7", "private (unique local)"), ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"), ("ff00::/8", "multicast"),
    ].map { (IPNetwork($0.0)!, $0.1) }

    /// Why a request may not go to `address` (which `host` resolved to); nil when it may.
    public func refusal(_ address: IPAddress, host: String) -> String? {
        if allows(host: host) || networks.contains(where: { $0.contains(address) }) { return nil }
        let judged = address.embeddedIPv4 ?? address
        if judged != address, networks.contains(where: { $0.contains(judged) }) { return nil }
        guard let (range, name) = Self.refused.first(where: { $0.0.contains(judged) }) else { return nil }
        let which = IPAddress(host) == nil ? "\(host) resolves to \(address), which" : "\(address)"
        return "\(which) is \(name) (\(range)): AdTally sends nothing there unless ADTALLY_OUTBOUND_ALLOW lists it"
    }
}

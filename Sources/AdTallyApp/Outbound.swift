import AdTallyCore
import AsyncHTTPClient
import Dispatch
import Foundation
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// The one way AdTally's own requests leave the server (alert webhooks, network
/// pulls, their token endpoints): the URL's host is resolved here, every address it
/// resolves to is judged by the `OutboundPolicy`, and the request goes to the address
/// judged, on a client of its own whose only resolution is that address
/// (`dnsOverride`: TLS still checks the certificate against the host name). No
/// redirect is followed, and a reconnect goes to the same address, so neither a
/// redirect, a second connection nor a resolver that answers differently the second
/// time reaches anything the check refused.
public struct OutboundGate: Sendable {
    public typealias Resolve = @Sendable (String) async throws -> [IPAddress]

    struct Refused: Error, CustomStringConvertible {
        var description: String
    }

    public var policy: OutboundPolicy
    /// How a host name becomes addresses (the system's resolver; tests give their own).
    public var resolve: Resolve

    public init(policy: OutboundPolicy = .defaultPolicy, resolve: @escaping Resolve = OutboundGate.systemResolve) {
        self.policy = policy
        self.resolve = resolve
    }

    /// The address a request to `url` goes to, or a refusal naming `field` and the rule.
    func destination(_ url: String, field: String) async throws -> (host: String, address: IPAddress) {
        guard let parsed = URL(string: url), let host = parsed.host, !host.isEmpty, ["http", "https"].contains(parsed.scheme ?? "") else {
            throw Refused(description: "\(field): must be an http or https URL with a host")
        }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let addresses: [IPAddress]
        if let literal = IPAddress(bare) {
            addresses = [literal]
        } else {
            do {
                addresses = try await resolve(bare)
            } catch {
                throw Refused(description: "\(field): \(bare) does not resolve (\(error))")
            }
        }
        guard let first = addresses.first else { throw Refused(description: "\(field): \(bare) resolves to no address") }
        // One refused address refuses the name: a rebinding answer mixes a good one in.
        for address in addresses {
            if let refusal = policy.refusal(address, host: bare) { throw Refused(description: "\(field): \(refusal)") }
        }
        return (host, first)
    }

    /// Sends `request` to the address its URL's host was judged to be, on a client of its
    /// own (no redirects, `connect` and `read` timeouts), and hands the answer to `read`
    /// before the client goes.
    func execute<T: Sendable>(
        _ request: HTTPClientRequest, field: String, connect: TimeAmount, read: TimeAmount, timeout: TimeAmount,
        _ body: (HTTPClientResponse) async throws -> T
    ) async throws -> T {
        let (host, address) = try await destination(request.url, field: field)
        var configuration = HTTPClient.Configuration(redirectConfiguration: .disallow, timeout: .init(connect: connect, read: read))
        configuration.dnsOverride = [host: address.description]
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        do {
            let response = try await client.execute(request, timeout: timeout)
            let result = try await body(response)
            try? await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    /// The system's resolver (getaddrinfo, on a thread of its own: it blocks).
    public static let systemResolve: Resolve = { host in
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                var hints = addrinfo()
                hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
                var list: UnsafeMutablePointer<addrinfo>?
                let status = getaddrinfo(host, nil, &hints, &list)
                guard status == 0 else {
                    continuation.resume(throwing: Refused(description: String(cString: gai_strerror(status))))
                    return
                }
                defer { freeaddrinfo(list) }
                var addresses: [IPAddress] = []
                var node = list
                while let entry = node?.pointee {
                    if let raw = entry.ai_addr {
                        if entry.ai_family == AF_INET {
                            let bytes = raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { pointer in
                                withUnsafeBytes(of: pointer.pointee.sin_addr) { Array($0) }
                            }
                            addresses.append(IPAddress(bytes: bytes))
                        } else if entry.ai_family == AF_INET6 {
                            let bytes = raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                                withUnsafeBytes(of: pointer.pointee.sin6_addr) { Array($0) }
                            }
                            addresses.append(IPAddress(bytes: bytes))
                        }
                    }
                    node = entry.ai_next
                }
                var seen = Set<IPAddress>()
                continuation.resume(returning: addresses.filter { seen.insert($0).inserted })
            }
        }
    }
}

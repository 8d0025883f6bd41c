import Foundation
import HTTPTypes
import NIOCore
import NIOHTTP1
import NIOHTTPTypes

/// Answers a request NIO's HTTP parser refused (oversized headers, Content-Length
/// together with Transfer-Encoding, bad chunking…) with problem+json and closes the
/// connection. Without it Hummingbird answers an empty 400, the one error response
/// AdTally gives that is not a problem document.
///
/// It sits behind the HTTP codec (`HTTP1Channel.Configuration.additionalChannelHandlers`),
/// so it sees parsed request parts and the responses written; it speaks only when
/// no response is being written, so it never cuts into one.
final class ParserErrorHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private var writingResponse = false
    private var answered = false

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head: writingResponse = true
        case .end: writingResponse = false
        case .body: break
        }
        context.write(data, promise: promise)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // EOF inside a request: the client has gone, so there is nobody to answer; the
        // route reading the body sees the error (and answers 499 for the metrics).
        guard let parserError = error as? HTTPParserError, parserError != .invalidEOFState, !writingResponse, !answered else {
            context.fireErrorCaught(error)
            return
        }
        answered = true
        let (status, detail) = Self.describe(parserError)
        let body: [String: Any] = ["type": "about:blank", "title": status.reasonPhrase, "status": status.code, "detail": detail]
        let json = (try? JSONSerialization.data(withJSONObject: body, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        var head = HTTPResponse(status: status)
        head.headerFields[.contentType] = "application/problem+json"
        head.headerFields[.contentLength] = "\(json.count)"
        head.headerFields[.connection] = "close"
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(bytes: json))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in context.close(promise: nil) }
    }

    static func describe(_ error: HTTPParserError) -> (HTTPResponse.Status, String) {
        switch error {
        case .headerOverflow:
            return (.requestHeaderFieldsTooLarge, "the request head (URL and headers) is larger than the server accepts")
        case .unexpectedContentLength, .unknown:
            // llhttp reports Content-Length with Transfer-Encoding, among others, as "unknown".
            return (.badRequest, "the request is not valid HTTP/1.1 (e.g. Content-Length together with Transfer-Encoding, or a malformed head)")
        case .invalidContentLength:
            return (.badRequest, "Content-Length is not a valid length")
        case .invalidChunkSize:
            return (.badRequest, "the chunked body has an invalid chunk size")
        default:
            return (.badRequest, "the request is not valid HTTP/1.1 (\(error))")
        }
    }
}

/// A new `ParserErrorHandler` for one connection.
public func makeParserErrorHandler() -> any RemovableChannelHandler { ParserErrorHandler() }

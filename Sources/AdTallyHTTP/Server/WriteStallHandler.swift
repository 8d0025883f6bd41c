import NIOCore

/// Closes a connection whose response has made no progress for `timeout`: the peer
/// stopped reading, the socket's buffers are full, and the channel has been unwritable
/// all that time. Hummingbird's idle timeout covers only the request side (a head or
/// body that never arrives); without this, a client that asks for a large CSV and never
/// reads it holds the response's writer — and the report connection and transaction
/// behind it — for as long as it keeps the socket open. Closing the channel fails the
/// pending write, so the report stream ends and its lease rolls back.
///
/// A slow reader that keeps reading makes the channel writable again now and then,
/// which restarts the clock: only a stall is cut, not a slow download.
final class WriteStallHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny

    private let timeout: TimeAmount
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            deadline?.cancel()
            deadline = nil
        } else if deadline == nil {
            deadline = context.eventLoop.scheduleTask(in: timeout) { [weak self] in
                guard let self, self.deadline != nil else { return }
                self.deadline = nil
                context.close(promise: nil)
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }
}

/// A new `WriteStallHandler` for one connection: a response that makes no progress
/// for `timeout` loses its connection.
public func makeWriteStallHandler(timeout: TimeAmount) -> any RemovableChannelHandler { WriteStallHandler(timeout: timeout) }

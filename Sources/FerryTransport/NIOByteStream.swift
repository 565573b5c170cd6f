import FerryCore
import FerrySync
import Foundation
import NIOCore
import NIOPosix

/// A byte stream over a NIO channel of bytes (a Unix socket, or a pair of pipes such as
/// stdin/stdout), for framed message endpoints.
final class NIOByteStream: ByteStream {
    let chunks: AsyncThrowingStream<[UInt8], any Error>
    private let continuation: AsyncThrowingStream<[UInt8], any Error>.Continuation
    private let outbound = Locked<NIOAsyncChannelOutboundWriter<ByteBuffer>?>(nil)
    private let started = Locked<[CheckedContinuation<Void, Never>]>([])
    private let finished = Locked(false)
    private let channel: any Channel

    init(_ asyncChannel: NIOAsyncChannel<ByteBuffer, ByteBuffer>) {
        (chunks, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        channel = asyncChannel.channel
        // Unowned: the pump ends when the channel closes (`executeThenClose`).
        Task { await self.pump(asyncChannel) }
    }

    private func pump(_ asyncChannel: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        do {
            try await asyncChannel.executeThenClose { inbound, outbound in
                self.outbound.withLock { $0 = outbound }
                self.wakeWriters()
                for try await var buffer in inbound {
                    if let bytes = buffer.readBytes(length: buffer.readableBytes) { self.continuation.yield(bytes) }
                }
                self.continuation.finish()
            }
        } catch {
            continuation.finish(throwing: SyncError.disconnected("\(error)"))
        }
        outbound.withLock { $0 = nil }
        finished.withLock { $0 = true }
        wakeWriters()
    }

    private func wakeWriters() {
        let waiters = started.withLock { w -> [CheckedContinuation<Void, Never>] in
            defer { w.removeAll() }
            return w
        }
        for w in waiters { w.resume() }
    }

    func write(_ bytes: [UInt8]) async throws(SyncError) {
        if outbound.withLock({ $0 }) == nil {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let ready = outbound.withLock { $0 != nil } || finished.withLock { $0 }
                if ready { c.resume() } else { started.withLock { $0.append(c) } }
            }
        }
        guard let writer = outbound.withLock({ $0 }) else { throw .disconnected("the stream is closed") }
        do { try await writer.write(ByteBuffer(bytes: bytes)) } catch { throw .disconnected("write failed: \(error)") }
    }

    func close() async {
        outbound.withLock { $0 }?.finish()
        try? await channel.close()
    }
}

/// Message endpoints over Unix domain sockets and pipes (stdio, a child process).
public enum ByteStreamTransport {
    /// Connects to a Unix domain socket served by `ferry serve --unix PATH`.
    public static func connectUnix(path: String) async throws -> any MessageEndpoint {
        do {
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connect(unixDomainSocketPath: path) { channel in
                    channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
                }
            return FramedEndpoint(NIOByteStream(channel))
        } catch {
            throw TransportError.connectFailed("cannot connect to unix:\(path): \(error)")
        }
    }

    /// Serves `handle` for every connection to a Unix domain socket at `path` until cancelled.
    /// A socket another process still serves is never replaced: that is `address_in_use`.
    public static func serveUnix(
        path: String, onBound: @Sendable () -> Void = {}, handle: @escaping @Sendable (any MessageEndpoint) async -> Void
    ) async throws {
        if isServed(unixSocket: path) {
            throw TransportError(.addressInUse, message: "Unix socket \(path) is in use", isTransient: false)
        }
        try? FileManager.default.removeItem(atPath: path)
        let server: NIOAsyncChannel<NIOAsyncChannel<ByteBuffer, ByteBuffer>, Never>
        do {
            server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true) { channel in
                    channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
                }
        } catch {
            throw TransportError.bindFailed("Unix socket \(path)", error: error)
        }
        chmod(path, 0o600)
        onBound()
        defer { try? FileManager.default.removeItem(atPath: path) }
        try await withThrowingDiscardingTaskGroup { group in
            try await server.executeThenClose { inbound in
                for try await connection in inbound {
                    group.addTask { await handle(FramedEndpoint(NIOByteStream(connection))) }
                }
            }
        }
    }

    /// Whether something accepts connections on the Unix socket at `path`.
    static func isServed(unixSocket path: String) -> Bool {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return withUnsafePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0 }
        }
    }

    /// A message endpoint on a pair of file descriptors (e.g. stdin 0 and stdout 1).
    public static func pipes(input: Int32, output: Int32) async throws -> any MessageEndpoint {
        let channel = try await NIOPipeBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .takingOwnershipOfDescriptors(input: input, output: output) { channel in
                channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
            }
        return FramedEndpoint(NIOByteStream(channel))
    }

    /// Runs `command` with `/bin/sh -c` and returns an endpoint on its stdin/stdout
    /// (`ferry sync --exec "ssh host ferry serve --stdio"`).
    public static func exec(command: String) async throws -> any MessageEndpoint {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        let toChild = Pipe()
        let fromChild = Pipe()
        process.standardInput = toChild
        process.standardOutput = fromChild
        do { try process.run() } catch { throw TransportError.connectFailed("cannot run \(command): \(error)") }
        let input = dup(fromChild.fileHandleForReading.fileDescriptor)
        let output = dup(toChild.fileHandleForWriting.fileDescriptor)
        try? fromChild.fileHandleForReading.close()
        try? toChild.fileHandleForWriting.close()
        return try await pipes(input: input, output: output)
    }
}

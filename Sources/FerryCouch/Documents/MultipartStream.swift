import FerryCore
import FerryCouchDocuments
import FerryStore
import Foundation
import NIOCore

/// Reads a `multipart/related` document body as it arrives: the first part (the document's
/// JSON) is kept in memory, bounded by `maxFirstPartBytes`; each later part goes to `sink`
/// chunk by chunk, so attachment parts of any size stream to disk. Only the last few bytes
/// (a possible delimiter) are held back between chunks.
struct MultipartStreamReader {
    /// What a part's sink is told.
    enum Event {
        /// A new part begins, with its headers (names lowercased).
        case begin([String: String])
        /// The next bytes of the current part.
        case bytes(ByteBuffer)
        /// The current part is complete.
        case end
        /// The first part (the document's JSON) is complete.
        case document([UInt8])
    }

    private enum State {
        case preamble
        case headers
        case body
        case done
    }

    let boundary: String
    let maxFirstPartBytes: Int
    private var state = State.preamble
    private var buffer = ByteBuffer()
    private var partIndex = -1
    /// The first part's bytes.
    private(set) var firstPart: [UInt8] = []
    private let delimiter: [UInt8]
    private let bodyDelimiter: [UInt8]

    init(boundary: String, maxFirstPartBytes: Int) {
        self.boundary = boundary
        self.maxFirstPartBytes = maxFirstPartBytes
        delimiter = Array("--\(boundary)".utf8)
        bodyDelimiter = Array("\r\n--\(boundary)".utf8)
    }

    /// Feeds the next bytes of the body; `sink` sees the parts after the first.
    mutating func feed(_ chunk: ByteBuffer, _ sink: (Event) throws -> Void) throws {
        var chunk = chunk
        buffer.writeBuffer(&chunk)
        try advance(sink)
    }

    /// The body ended: it must have ended with the closing delimiter.
    func finish() throws(CouchError) {
        guard state == .done else { throw .badRequest("multipart body is not closed by --\(boundary)--") }
        guard partIndex >= 0 else { throw .badRequest("multipart body has no document part") }
    }

    private mutating func advance(_ sink: (Event) throws -> Void) throws {
        while true {
            let view = buffer.readableBytesView
            switch state {
            case .done:
                buffer.clear()
                return
            case .preamble:
                let bytes = Array(view)
                guard let at = Multipart.find(delimiter, in: bytes, from: 0) else {
                    // Keep only what could still begin a delimiter.
                    let keep = min(bytes.count, delimiter.count - 1)
                    buffer.moveReaderIndex(forwardBy: bytes.count - keep)
                    buffer.discardReadBytes()
                    return
                }
                // The two bytes after it tell a closing delimiter from a part's start.
                guard at + delimiter.count + 2 <= bytes.count else {
                    buffer.moveReaderIndex(forwardBy: at)
                    buffer.discardReadBytes()
                    return
                }
                buffer.moveReaderIndex(forwardBy: at + delimiter.count)
                afterDelimiter()
            case .headers:
                let bytes = Array(view)
                guard let end = Multipart.find([0x0D, 0x0A, 0x0D, 0x0A], in: bytes, from: 0) else {
                    if bytes.count > Multipart.maxHeaderBytes { throw CouchError.badRequest("multipart part headers are too long") }
                    // A part with no headers at all begins right away with its blank line.
                    if bytes.count >= 2 && bytes[0] == 0x0D && bytes[1] == 0x0A {
                        buffer.moveReaderIndex(forwardBy: 2)
                        try beginPart([:], sink)
                        continue
                    }
                    return
                }
                if bytes.count >= 2 && bytes[0] == 0x0D && bytes[1] == 0x0A {
                    buffer.moveReaderIndex(forwardBy: 2)
                    try beginPart([:], sink)
                    continue
                }
                guard end <= Multipart.maxHeaderBytes else { throw CouchError.badRequest("multipart part headers are too long") }
                var headers: [String: String] = [:]
                for line in String(decoding: bytes[0..<end], as: UTF8.self).components(separatedBy: "\r\n") where !line.isEmpty {
                    guard let colon = line.firstIndex(of: ":") else { throw CouchError.badRequest("malformed multipart header: \(line)") }
                    headers[line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()] =
                        line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                }
                buffer.moveReaderIndex(forwardBy: end + 4)
                try beginPart(headers, sink)
            case .body:
                let bytes = Array(view)
                if let at = Multipart.find(bodyDelimiter, in: bytes, from: 0) {
                    try emit(buffer.readSlice(length: at)!, sink)
                    guard at + bodyDelimiter.count + 2 <= bytes.count else {
                        buffer.discardReadBytes()
                        return
                    }
                    buffer.moveReaderIndex(forwardBy: bodyDelimiter.count)
                    try sink(partIndex > 0 ? .end : .document(firstPart))
                    afterDelimiter()
                    continue
                }
                // All but what could be the start of a delimiter goes out now.
                let safe = bytes.count - min(bytes.count, bodyDelimiter.count + 1)
                if safe > 0 { try emit(buffer.readSlice(length: safe)!, sink) }
                buffer.discardReadBytes()
                return
            }
        }
    }

    /// After a delimiter (at least two bytes follow it): `--` closes the body; otherwise a
    /// line end starts the next part's headers.
    private mutating func afterDelimiter() {
        let view = buffer.readableBytesView
        if view[view.startIndex] == 0x2D && view[view.startIndex + 1] == 0x2D {
            state = .done
            return
        }
        if view[view.startIndex] == 0x0D && view[view.startIndex + 1] == 0x0A { buffer.moveReaderIndex(forwardBy: 2) }
        state = .headers
    }

    private mutating func beginPart(_ headers: [String: String], _ sink: (Event) throws -> Void) throws {
        partIndex += 1
        guard partIndex < Multipart.maxParts else { throw CouchError.badRequest("multipart body has too many parts") }
        state = .body
        if partIndex > 0 { try sink(.begin(headers)) }
    }

    private mutating func emit(_ slice: ByteBuffer, _ sink: (Event) throws -> Void) throws {
        guard slice.readableBytes > 0 else { return }
        if partIndex == 0 {
            guard firstPart.count + slice.readableBytes <= maxFirstPartBytes else {
                throw CouchError.tooLarge("The document part is larger than \(maxFirstPartBytes) bytes.")
            }
            firstPart.append(contentsOf: slice.readableBytesView)
        } else {
            try sink(.bytes(slice))
        }
    }
}

import CZlib
import FerryCore

// Hand-rolled over the system zlib: BLIP needs one raw-deflate context per direction shared
// by every compressed frame, each frame sync-flushed with its `00 00 FF FF` trailer removed,
// and a running CRC32 per direction, none of which a listed library exposes.

/// Encodes the frames one side sends on one connection, in order: the running CRC32 and the
/// deflate context of the direction live here, so every frame of the connection must pass
/// through the same encoder.
public final class BLIPFrameEncoder {
    private var crc: UInt32 = 0
    private var stream = z_stream()
    private var deflating = false

    public init() {}

    deinit { if deflating { deflateEnd(&stream) } }

    /// The frame's bytes: varint number, varint flags, the data (deflated when `compressed`),
    /// then, except on an ACK, the running CRC32 of every data byte sent so far, big-endian.
    public func encode(_ frame: BLIPFrame) throws(BLIPError) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(frame.data.count + 16)
        Varint.write(frame.number, into: &out)
        Varint.write(UInt64(frame.type.rawValue | frame.flags.rawValue), into: &out)
        if frame.type.isAck {
            out += frame.data
            return out
        }
        crc = frame.data.withUnsafeBufferPointer { b in
            UInt32(crc32(uLong(crc), b.baseAddress, uInt(b.count)))
        }
        if frame.flags.contains(.compressed) { out += try deflated(frame.data) } else { out += frame.data }
        withUnsafeBytes(of: crc.bigEndian) { out += $0 }
        return out
    }

    private func deflated(_ data: [UInt8]) throws(BLIPError) -> [UInt8] {
        if !deflating {
            // Raw deflate (negative window bits): no zlib header or trailer. Level 1, the
            // fastest: it was a third of the node's CPU in a pull at level 6, and on a LAN the
            // CPU is dearer than the few percent of bytes the higher levels save on JSON.
            guard deflateInit2_(&stream, 1, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK
            else { throw BLIPError("cannot start deflate") }
            deflating = true
        }
        var input = data
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: max(1024, data.count / 2 + 64))
        let status: Int32 = input.withUnsafeMutableBufferPointer { inBuf in
            stream.next_in = inBuf.baseAddress
            stream.avail_in = uInt(inBuf.count)
            var status = Z_OK
            repeat {
                status = chunk.withUnsafeMutableBufferPointer { c in
                    stream.next_out = c.baseAddress
                    stream.avail_out = uInt(c.count)
                    let s = deflate(&stream, Z_SYNC_FLUSH)
                    out += c[0..<(c.count - Int(stream.avail_out))]
                    return s
                }
            } while status == Z_OK && stream.avail_out == 0
            stream.next_in = nil
            return status
        }
        guard status == Z_OK || status == Z_BUF_ERROR, out.count >= 4, out.suffix(4) == [0, 0, 0xFF, 0xFF] else {
            throw BLIPError("deflate failed (\(status))")
        }
        return Array(out.dropLast(4))
    }
}

/// Decodes the frames one side receives on one connection, in order, checking the running
/// CRC32 and inflating compressed frames through the direction's one context.
public final class BLIPFrameDecoder {
    private var crc: UInt32 = 0
    private var stream = z_stream()
    private var inflating = false
    /// The most bytes one frame may inflate to (a deflate bomb closes the connection).
    public let maxFrameData: Int

    public init(maxFrameData: Int = 1 << 20) { self.maxFrameData = maxFrameData }

    deinit { if inflating { inflateEnd(&stream) } }

    public func decode(_ bytes: [UInt8]) throws(BLIPError) -> BLIPFrame {
        guard let (number, n1) = Varint.read(bytes, at: 0) else { throw BLIPError("frame header is truncated") }
        guard let (rawFlags, n2) = Varint.read(bytes, at: n1) else { throw BLIPError("frame header is truncated") }
        guard rawFlags <= 0xFF, UInt8(rawFlags) & ~BLIPFrameFlags.known == 0 else { throw BLIPError("frame has unknown flags \(rawFlags)") }
        let flagBits = UInt8(rawFlags)
        guard let type = BLIPMessageType(rawValue: flagBits & BLIPFrameFlags.typeMask) else {
            throw BLIPError("frame has unknown message type \(flagBits & BLIPFrameFlags.typeMask)")
        }
        let flags = BLIPFrameFlags(rawValue: flagBits & ~BLIPFrameFlags.typeMask)
        let start = n1 + n2
        if type.isAck { return BLIPFrame(number: number, type: type, flags: flags, data: Array(bytes[start...])) }
        guard bytes.count - start >= 4 else { throw BLIPError("frame lacks its checksum") }
        let payload = Array(bytes[start..<(bytes.count - 4)])
        let data = flags.contains(.compressed) ? try inflated(payload) : payload
        crc = data.withUnsafeBufferPointer { b in UInt32(crc32(uLong(crc), b.baseAddress, uInt(b.count))) }
        let sent = bytes.suffix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard sent == crc else { throw BLIPError("frame checksum does not match (a lost or altered frame)") }
        return BLIPFrame(number: number, type: type, flags: flags, data: data, wireSize: bytes.count - start)
    }

    private func inflated(_ payload: [UInt8]) throws(BLIPError) -> [UInt8] {
        if !inflating {
            guard inflateInit2_(&stream, -MAX_WBITS, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
                throw BLIPError("cannot start inflate")
            }
            inflating = true
        }
        var input = payload + [0, 0, 0xFF, 0xFF]
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        var status = Z_OK
        input.withUnsafeMutableBufferPointer { inBuf in
            stream.next_in = inBuf.baseAddress
            stream.avail_in = uInt(inBuf.count)
            repeat {
                status = chunk.withUnsafeMutableBufferPointer { c in
                    stream.next_out = c.baseAddress
                    stream.avail_out = uInt(c.count)
                    let s = inflate(&stream, Z_SYNC_FLUSH)
                    out += c[0..<(c.count - Int(stream.avail_out))]
                    return s
                }
            } while status == Z_OK && (stream.avail_in > 0 || stream.avail_out == 0) && out.count <= maxFrameData
            stream.next_in = nil
        }
        guard out.count <= maxFrameData else { throw BLIPError("a compressed frame inflates past \(maxFrameData) bytes") }
        guard status == Z_OK || status == Z_BUF_ERROR else { throw BLIPError("compressed frame is not valid deflate data (\(status))") }
        return out
    }
}

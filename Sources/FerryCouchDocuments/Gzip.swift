import CZlib

/// gzip as the CouchDB API meets it: request bodies and attachment content that CouchDB's
/// replicator sends gzip-encoded (`"encoding":"gzip"`) are decoded, as Ferry keeps identity
/// bytes only; content is encoded again as CouchDB encodes it to match CouchDB's digests.
package enum Gzip {
    /// The decoded bytes, at most `limit` of them; nil for anything that is not valid gzip
    /// or decodes to more than `limit`.
    package static func decode(_ input: [UInt8], limit: Int) -> [UInt8]? {
        if case .decoded(let bytes) = decodeChecked(input, limit: limit) { return bytes }
        return nil
    }

    /// What decoding a gzip stream gave: its bytes, or why there are none.
    package enum Outcome: Equatable {
        case decoded([UInt8])
        /// The stream decodes to more than the limit.
        case tooLarge
        /// Not a complete, valid gzip stream.
        case corrupt
    }

    /// Decodes a gzip stream, telling a stream too large for `limit` from a corrupt one.
    package static func decodeChecked(_ input: [UInt8], limit: Int) -> Outcome {
        guard !input.isEmpty else { return .corrupt }
        var stream = z_stream()
        // 16 + MAX_WBITS: expect a gzip header and trailer (and check the CRC).
        guard inflateInit2_(&stream, 16 + MAX_WBITS, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            return .corrupt
        }
        defer { inflateEnd(&stream) }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        var input = input
        return input.withUnsafeMutableBufferPointer { inBuf -> Outcome in
            stream.next_in = inBuf.baseAddress
            stream.avail_in = UInt32(inBuf.count)
            while true {
                let status = chunk.withUnsafeMutableBufferPointer { outBuf -> Int32 in
                    stream.next_out = outBuf.baseAddress
                    stream.avail_out = UInt32(outBuf.count)
                    return inflate(&stream, Z_NO_FLUSH)
                }
                let produced = chunk.count - Int(stream.avail_out)
                output.append(contentsOf: chunk[0..<produced])
                if output.count > limit { return .tooLarge }
                switch status {
                case Z_STREAM_END: return stream.avail_in == 0 ? .decoded(output) : .corrupt
                case Z_OK: if produced == 0 && stream.avail_in == 0 { return .corrupt }
                default: return .corrupt
                }
            }
        }
    }

    /// `bytes` gzip-encoded as CouchDB encodes attachments (deflate level 8, a header with
    /// no name and no time), so that an MD5 CouchDB took of its encoded form can be matched;
    /// nil if zlib fails.
    package static func encode(_ bytes: [UInt8], level: Int32 = 8) -> [UInt8]? {
        var stream = z_stream()
        guard deflateInit2_(
            &stream, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
            Int32(MemoryLayout<z_stream>.size)) == Z_OK
        else { return nil }
        defer { deflateEnd(&stream) }
        var output = [UInt8](repeating: 0, count: Int(deflateBound(&stream, UInt(bytes.count))) + 32)
        var input = bytes
        let status = input.withUnsafeMutableBufferPointer { inBuf in
            output.withUnsafeMutableBufferPointer { outBuf -> Int32 in
                stream.next_in = inBuf.baseAddress
                stream.avail_in = UInt32(inBuf.count)
                stream.next_out = outBuf.baseAddress
                stream.avail_out = UInt32(outBuf.count)
                return deflate(&stream, Z_FINISH)
            }
        }
        guard status == Z_STREAM_END else { return nil }
        return Array(output.prefix(Int(stream.total_out)))
    }
}

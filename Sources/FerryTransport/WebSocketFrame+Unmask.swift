import NIOCore
import NIOWebSocket

extension WebSocketFrame {
    /// The payload, unmasked, as bytes: eight at a time against the key repeated.
    ///
    /// NIO's `unmaskedData` XORs byte by byte through an enumerated sequence; in a debug
    /// build (what `make run` starts) that loop held a node's event loops for most of a
    /// 200 MB blob's fan-out to four peers. Same result, for any key and length
    /// (`WebSocketUnmaskTests`).
    var unmaskedBytes: [UInt8] {
        var bytes = Array(data.readableBytesView)
        guard let key = maskKey else { return bytes }
        let k = (key[0], key[1], key[2], key[3])
        var pattern: UInt64 = 0
        withUnsafeMutableBytes(of: &pattern) { p in
            for i in 0..<8 { p[i] = [k.0, k.1, k.2, k.3][i % 4] }
        }
        bytes.withUnsafeMutableBytes { raw in
            let n = raw.count
            var i = 0
            while i + 8 <= n {
                raw.storeBytes(of: raw.loadUnaligned(fromByteOffset: i, as: UInt64.self) ^ pattern, toByteOffset: i, as: UInt64.self)
                i += 8
            }
            while i < n {
                raw[i] ^= [k.0, k.1, k.2, k.3][i % 4]
                i += 1
            }
        }
        return bytes
    }
}

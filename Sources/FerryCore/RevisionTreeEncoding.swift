/// A compact binary encoding of revision trees, as the store keeps them.
///
/// Hand-rolled rather than Codable/JSON because it is on the write path of every
/// save: it must be small and fast. Layout (all integers LEB128 varints):
/// `version(=1) count { generation digest[32] parent+1 flags hlc:u64le [bodyLen body] }`,
/// where flags bit 0 = deleted, bit 1 = has body, bit 2 = leaf.
extension RevisionTree {
    public func encoded(omittingBodyAt omitted: Int? = nil) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(48 * revisions.count + 8)
        out.append(1)
        Varint.write(UInt64(revisions.count), into: &out)
        for (i, r) in revisions.enumerated() {
            Varint.write(UInt64(r.id.generation), into: &out)
            r.id.appendDigestBytes(to: &out)
            Varint.write(UInt64(r.parent.map { $0 + 1 } ?? 0), into: &out)
            let body = i == omitted ? nil : r.body
            var flags: UInt8 = 0
            if r.deleted { flags |= 1 }
            if body != nil { flags |= 2 }
            if r.isLeaf { flags |= 4 }
            out.append(flags)
            withUnsafeBytes(of: r.hlc.rawValue.littleEndian) { out.append(contentsOf: $0) }
            if let body {
                Varint.write(UInt64(body.count), into: &out)
                out.append(contentsOf: body)
            }
        }
        return out
    }

    public init(encoded bytes: some Collection<UInt8>) throws(RevisionTreeError) {
        let b = Array(bytes)
        var pos = 0
        func need(_ n: Int) throws(RevisionTreeError) {
            if b.count - pos < n { throw .corruptEncoding("truncated") }
        }
        func varint() throws(RevisionTreeError) -> UInt64 {
            guard let (v, used) = Varint.read(b, at: pos) else { throw .corruptEncoding("bad varint") }
            pos += used
            return v
        }
        try need(1)
        guard b[0] == 1 else { throw .corruptEncoding("unknown version \(b[0])") }
        pos = 1
        let count = Int(try varint())
        guard count <= b.count else { throw .corruptEncoding("implausible count") }
        var revs: [Revision] = []
        revs.reserveCapacity(count)
        for _ in 0..<count {
            let gen = try varint()
            try need(32)
            guard gen >= 1, gen <= UInt64(Int32.max) else { throw .corruptEncoding("bad generation") }
            let id = RevisionID(generation: Int(gen), digestBytes: b[pos..<pos + 32])
            pos += 32
            let parentPlusOne = try varint()
            guard parentPlusOne <= UInt64(revs.count) else { throw .corruptEncoding("parent out of order") }
            try need(9)
            let flags = b[pos]
            pos += 1
            var raw: UInt64 = 0
            for k in 0..<8 { raw |= UInt64(b[pos + k]) << (8 * UInt64(k)) }
            pos += 8
            var body: [UInt8]?
            if flags & 2 != 0 {
                let len = Int(try varint())
                try need(len)
                body = Array(b[pos..<pos + len])
                pos += len
            }
            revs.append(
                Revision(
                    id: id, parent: parentPlusOne == 0 ? nil : Int(parentPlusOne - 1), deleted: flags & 1 != 0,
                    body: body, hlc: HLCTimestamp(rawValue: raw), isLeaf: flags & 4 != 0))
        }
        guard pos == b.count else { throw .corruptEncoding("trailing bytes") }
        var hasChild = [Bool](repeating: false, count: revs.count)
        for r in revs { if let p = r.parent { hasChild[p] = true } }
        for (i, r) in revs.enumerated() where r.isLeaf == hasChild[i] {
            throw .corruptEncoding("leaf flag of \(r.id) disagrees with the tree")
        }
        self.init()
        self.revisions = revs
    }

    /// Puts a body back into the revision at `index` (the store keeps the winner's body
    /// outside the encoded tree).
    public mutating func restoreBody(_ body: [UInt8], at index: Int) { setBody(body, at: index) }
}

/// Unsigned LEB128 varints.
public enum Varint {
    public static func write(_ value: UInt64, into out: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            out.append(UInt8(v & 0x7F) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    /// The value and the number of bytes it used, or nil if truncated or over 64 bits.
    public static func read(_ bytes: [UInt8], at start: Int) -> (UInt64, Int)? {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        var i = start
        while i < bytes.count {
            let b = bytes[i]
            if shift == 63 && b > 1 { return nil }
            result |= UInt64(b & 0x7F) << shift
            i += 1
            if b & 0x80 == 0 { return (result, i - start) }
            shift += 7
            if shift > 63 { return nil }
        }
        return nil
    }
}

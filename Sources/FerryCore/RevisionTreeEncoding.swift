/// A compact binary encoding of revision trees, as the store keeps them.
///
/// Hand-rolled rather than Codable/JSON because it is on the write path of every
/// save: it must be small and fast. Layout (all integers LEB128 varints):
/// `version(=1) count { generation digest[32] parent+1 flags hlc:u64le [bodyLen body] }`,
/// where flags bit 0 = deleted, bit 1 = has body, bit 2 = leaf.
///
/// Version 2 carries revision IDs made elsewhere: each `digest[32]` becomes `form hash`, with
/// form 0 = Ferry digest (32 bytes), 1 = 32-hex hash (16 bytes), 2 = other (length, text).
/// It is written only for trees that hold such an ID, so Ferry-only trees stay version 1,
/// byte for byte, and databases written before it read unchanged.
extension RevisionTree {
    public func encoded(omittingBodyAt omitted: Int? = nil) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(48 * revisions.count + 8)
        let version: UInt8 = revisions.allSatisfy(\.id.isFerryDigest) ? 1 : 2
        out.append(version)
        Varint.write(UInt64(revisions.count), into: &out)
        for (i, r) in revisions.enumerated() {
            Varint.write(UInt64(r.id.generation), into: &out)
            if version == 2 { out.append(r.id.form.rawValue) }
            switch r.id.form {
            case .ferryDigest: r.id.appendFerryDigestBytes(to: &out)
            case .hex32: out.append(contentsOf: r.id.collationBytes)
            case .text:
                let text = r.id.collationBytes
                Varint.write(UInt64(text.count), into: &out)
                out.append(contentsOf: text)
            }
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
        let version = b[0]
        guard version == 1 || version == 2 else { throw .corruptEncoding("unknown version \(version)") }
        pos = 1
        let count = Int(try varint())
        guard count <= b.count else { throw .corruptEncoding("implausible count") }
        var revs: [Revision] = []
        revs.reserveCapacity(count)
        for _ in 0..<count {
            let gen = try varint()
            guard gen >= 1, gen <= UInt64(Int32.max) else { throw .corruptEncoding("bad generation") }
            var form = RevisionID.Form.ferryDigest
            if version == 2 {
                try need(1)
                guard let f = RevisionID.Form(rawValue: b[pos]) else { throw .corruptEncoding("bad revision ID form") }
                form = f
                pos += 1
            }
            let id: RevisionID
            switch form {
            case .ferryDigest:
                try need(32)
                id = RevisionID(generation: Int(gen), ferryDigestBytes: b[pos..<pos + 32])
                pos += 32
            case .hex32:
                try need(16)
                id = try Self.decodedID(generation: Int(gen), hash: Hex.encode(b[pos..<pos + 16]), form: form)
                pos += 16
            case .text:
                let len = Int(try varint())
                guard len <= RevisionID.maxHashLength else { throw .corruptEncoding("revision hash too long") }
                try need(len)
                id = try Self.decodedID(
                    generation: Int(gen), hash: String(decoding: b[pos..<pos + len], as: UTF8.self), form: form)
                pos += len
            }
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

    /// A revision ID read from version 2, which must come back in the form it was written.
    private static func decodedID(generation: Int, hash: String, form: RevisionID.Form) throws(RevisionTreeError)
        -> RevisionID
    {
        guard let id = try? RevisionID(generation: generation, hash: hash), id.form == form, id.hashText == hash else {
            throw .corruptEncoding("bad revision hash \"\(LogText.escape(hash))\"")
        }
        return id
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

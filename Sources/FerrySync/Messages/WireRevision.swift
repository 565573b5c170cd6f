import FerryCore
import FerryStore

/// A revision as it travels in `getRevs` replies and `putRevs` requests: its canonical
/// body bytes, or a delta against a base revision the receiver said it holds.
///
/// Batches use a binary layout (docs/protocol.md §4) so bodies travel as the exact
/// canonical bytes the sender stores: no re-encoding on either side.
package struct WireRevision: Sendable {
    package var id: String
    package var rev: String
    package var history: [String]
    package var deleted: Bool
    package var hlc: UInt64
    /// Canonical JSON body, or the JSON delta when `deltaBase` is set; empty when `missing`.
    package var content: [UInt8]
    package var deltaBase: String?
    /// The sender no longer has this revision (or may not send it).
    package var missing = false

    package var isDelta: Bool { deltaBase != nil }

    package static func missing(id: String, rev: String) -> WireRevision {
        WireRevision(id: id, rev: rev, history: [], deleted: false, hlc: 0, content: [], deltaBase: nil, missing: true)
    }

    package var metadata: JSON {
        var o: [String: JSON] = ["id": .string(id), "rev": .string(rev)]
        if missing {
            o["missing"] = true
            return .object(o)
        }
        o["history"] = .array(history.map { .string($0) })
        o["hlc"] = .int(Int64(bitPattern: hlc))
        if deleted { o["deleted"] = true }
        if let deltaBase { o["deltaBase"] = .string(deltaBase) }
        return .object(o)
    }

    /// Appends `metadata.canonicalBytes`, written field by field in canonical (sorted) key
    /// order: a reply holds hundreds of these, and building a dictionary for each showed in profiles.
    package func writeMetadata(into out: inout [UInt8]) {
        func key(_ k: String, first: Bool = false) {
            if !first { out.append(UInt8(ascii: ",")) }
            JSON.appendCanonical(string: k, to: &out)
            out.append(UInt8(ascii: ":"))
        }
        out.append(UInt8(ascii: "{"))
        if missing {
            key("id", first: true)
            JSON.appendCanonical(string: id, to: &out)
            key("missing")
            out.append(contentsOf: "true".utf8)
        } else {
            var first = true
            if deleted {
                key("deleted", first: true)
                out.append(contentsOf: "true".utf8)
                first = false
            }
            if let deltaBase {
                key("deltaBase", first: first)
                JSON.appendCanonical(string: deltaBase, to: &out)
                first = false
            }
            key("history", first: first)
            out.append(UInt8(ascii: "["))
            for (i, h) in history.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSON.appendCanonical(string: h, to: &out)
            }
            out.append(UInt8(ascii: "]"))
            key("hlc")
            out.append(contentsOf: String(Int64(bitPattern: hlc)).utf8)
            key("id")
            JSON.appendCanonical(string: id, to: &out)
        }
        key("rev")
        JSON.appendCanonical(string: rev, to: &out)
        out.append(UInt8(ascii: "}"))
    }

    /// `varint(count)` then per revision `varint(len) metadata-JSON varint(len) content`.
    package static func encodeBatch(_ revisions: [WireRevision]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(revisions.reduce(16) { $0 + $1.content.count + 200 })
        Varint.write(UInt64(revisions.count), into: &out)
        var meta: [UInt8] = []
        meta.reserveCapacity(512)
        for r in revisions {
            meta.removeAll(keepingCapacity: true)
            r.writeMetadata(into: &meta)
            Varint.write(UInt64(meta.count), into: &out)
            out.append(contentsOf: meta)
            Varint.write(UInt64(r.content.count), into: &out)
            out.append(contentsOf: r.content)
        }
        return out
    }

    package static func decodeBatch(_ bytes: [UInt8]) throws(SyncError) -> [WireRevision] {
        var pos = 0
        func chunk() throws(SyncError) -> ArraySlice<UInt8> {
            guard let (len, used) = Varint.read(bytes, at: pos), len <= UInt64(max(0, bytes.count - pos - used)) else {
                throw .protocolViolation("revision batch is truncated")
            }
            pos += used
            defer { pos += Int(len) }
            return bytes[pos..<pos + Int(len)]
        }
        guard let (count, used) = Varint.read(bytes, at: 0), count <= UInt64(bytes.count) else {
            throw .protocolViolation("revision batch has a bad count")
        }
        pos = used
        var out: [WireRevision] = []
        for _ in 0..<Int(count) {
            let metaBytes = try chunk()
            let content = Array(try chunk())
            let meta: JSON
            do { meta = try JSON.parse(metaBytes) } catch { throw .protocolViolation("revision metadata: \(error)") }
            out.append(try WireRevision(metadata: meta, content: content))
        }
        guard pos == bytes.count else { throw .protocolViolation("trailing bytes after a revision batch") }
        return out
    }

    package init(
        id: String, rev: String, history: [String], deleted: Bool, hlc: UInt64, content: [UInt8], deltaBase: String?,
        missing: Bool = false
    ) {
        self.id = id
        self.rev = rev
        self.history = history
        self.deleted = deleted
        self.hlc = hlc
        self.content = content
        self.deltaBase = deltaBase
        self.missing = missing
    }

    package init(metadata o: JSON, content: [UInt8]) throws(SyncError) {
        guard let id = o["id"]?.stringValue, let rev = o["rev"]?.stringValue else {
            throw .protocolViolation("revision entry lacks \"id\" or \"rev\"")
        }
        if o["missing"] == .bool(true) {
            self = .missing(id: id, rev: rev)
            return
        }
        guard case .array(let h)? = o["history"] else { throw .protocolViolation("revision entry lacks \"history\"") }
        var history: [String] = []
        for x in h {
            guard let s = x.stringValue else { throw .protocolViolation("history entries must be strings") }
            history.append(s)
        }
        self.init(
            id: id, rev: rev, history: history, deleted: o["deleted"]?.boolValue ?? false,
            hlc: UInt64(bitPattern: o["hlc"]?.intValue ?? 0), content: content, deltaBase: o["deltaBase"]?.stringValue)
    }

    /// Builds the wire form of a held revision, as a delta against one of `receiverHas`
    /// when that is smaller than 90% of the full body.
    package static func make(
        id: DocumentID, revision: RevisionID, tree: RevisionTree, receiverHas: [RevisionID], useDeltas: Bool,
        maxHistory: Int
    ) -> (WireRevision, usedDelta: Bool)? {
        guard let r = tree.revision(revision), let bodyBytes = r.body else { return nil }
        let history = tree.history(of: revision, limit: maxHistory + 1).dropFirst().map(\.description)
        var wire = WireRevision(
            id: id.rawValue, rev: revision.description, history: Array(history), deleted: r.deleted,
            hlc: r.hlc.rawValue, content: bodyBytes, deltaBase: nil)
        let bases = receiverHas.filter { tree.revision($0)?.body != nil }
        // Only a Ferry-form revision is delta-encoded: the receiver checks the result against its digest.
        guard useDeltas, revision.isFerryDigest, !bases.isEmpty, let target = try? JSON.parse(bodyBytes).objectValue else { return (wire, false) }
        var best: (String, [UInt8])?
        for base in bases {
            guard let b = tree.revision(base)?.body, let baseBody = try? JSON.parse(b).objectValue else { continue }
            let delta = JSONDelta.diff(from: baseBody, to: target).canonicalBytes
            if best == nil || delta.count < best!.1.count { best = (base.description, delta) }
        }
        // Blobs are referenced, never inlined, so a delta never carries blob content.
        if let best, best.1.count < bodyBytes.count * 9 / 10 {
            wire.content = best.1
            wire.deltaBase = best.0
            return (wire, true)
        }
        return (wire, false)
    }
}

extension WireRevision {
    /// The inline form of a fresh revision, small enough to ride in a changes reply or a
    /// push without a round trip of its own: a delta against its parent, or the whole body
    /// of a first generation. Nil when neither fits in `limit` bytes (the revision then
    /// travels the usual way). Only the parent is sent as history: a delta applies only
    /// where the parent's body is held, so the receiver's tree already knows the rest.
    static func inline(id: DocumentID, revision: RevisionID, tree: RevisionTree, useDeltas: Bool, limit: Int) -> WireRevision? {
        guard limit > 0, tree.revision(revision)?.body != nil else { return nil }
        if let parent = tree.history(of: revision, limit: 2).dropFirst().first {
            guard useDeltas,
                let (wire, usedDelta) = make(id: id, revision: revision, tree: tree, receiverHas: [parent], useDeltas: true, maxHistory: 1),
                usedDelta, wire.content.count <= limit
            else { return nil }
            return wire
        }
        guard let (wire, _) = make(id: id, revision: revision, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 1),
            wire.content.count <= limit
        else { return nil }
        return wire
    }

    /// The JSON carried as a changes entry's sixth element: `history`, `hlc`, `deleted`
    /// when true, and `delta` (against `history[0]`) or `body`.
    var inlineJSON: JSON? {
        guard let content = try? JSON.parse(content) else { return nil }
        var o: [String: JSON] = ["history": .array(history.map { .string($0) }), "hlc": .int(Int64(bitPattern: hlc))]
        if deleted { o["deleted"] = true }
        o[isDelta ? "delta" : "body"] = content
        return .object(o)
    }

    /// Reads a changes entry's inline revision; nil when it is malformed (the revision is
    /// then fetched the usual way, and judged there).
    init?(inline o: JSON, id: String, rev: String) {
        guard case .array(let h)? = o["history"], let hlc = o["hlc"]?.intValue else { return nil }
        let history = h.compactMap(\.stringValue)
        guard history.count == h.count else { return nil }
        if let delta = o["delta"], let base = history.first {
            self.init(id: id, rev: rev, history: history, deleted: o["deleted"] == true, hlc: UInt64(bitPattern: hlc),
                content: delta.canonicalBytes, deltaBase: base)
        } else if let body = o["body"] {
            self.init(id: id, rev: rev, history: history, deleted: o["deleted"] == true, hlc: UInt64(bitPattern: hlc),
                content: body.canonicalBytes, deltaBase: nil)
        } else {
            return nil
        }
    }
}

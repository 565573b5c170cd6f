import FerryCore

/// A JSON delta: the changes that turn one object into another.
///
/// Format (documented in docs/protocol.md): an object with up to three members:
/// `"set"`: members added or replaced (values in full), `"del"`: member names removed,
/// `"sub"`: members that are objects on both sides, with a nested delta each.
/// Arrays and scalars are replaced whole.
public enum JSONDelta {
    /// The delta from `base` to `target`, both objects.
    public static func diff(from base: [String: JSON], to target: [String: JSON]) -> JSON {
        var set: [String: JSON] = [:]
        var sub: [String: JSON] = [:]
        var del: [JSON] = []
        for (k, v) in target {
            guard let old = base[k] else {
                set[k] = v
                continue
            }
            if old == v { continue }
            if case .object(let o) = old, case .object(let n) = v {
                let nested = diff(from: o, to: n)
                // A nested delta only pays when it is smaller than the value itself.
                if nested.canonicalBytes.count < v.canonicalBytes.count {
                    sub[k] = nested
                    continue
                }
            }
            set[k] = v
        }
        for k in base.keys where target[k] == nil { del.append(.string(k)) }
        var out: [String: JSON] = [:]
        if !set.isEmpty { out["set"] = .object(set) }
        if !sub.isEmpty { out["sub"] = .object(sub) }
        if !del.isEmpty { out["del"] = .array(del.sorted { ($0.stringValue ?? "") < ($1.stringValue ?? "") }) }
        return .object(out)
    }

    /// Applies a delta to `base`. Throws if the delta is malformed or does not fit the base.
    public static func apply(_ delta: JSON, to base: [String: JSON]) throws(SyncError) -> [String: JSON] {
        guard let d = delta.objectValue else { throw .protocolViolation("delta is not an object") }
        var out = base
        for key in d.keys where !["set", "sub", "del"].contains(key) {
            throw .protocolViolation("unknown delta member \"\(key)\"")
        }
        if let del = d["del"] {
            guard case .array(let names) = del else { throw .protocolViolation("delta \"del\" is not an array") }
            for n in names {
                guard let name = n.stringValue, out.removeValue(forKey: name) != nil else {
                    throw .protocolViolation("delta deletes a member the base lacks")
                }
            }
        }
        if let set = d["set"] {
            guard let fields = set.objectValue else { throw .protocolViolation("delta \"set\" is not an object") }
            for (k, v) in fields { out[k] = v }
        }
        if let sub = d["sub"] {
            guard let fields = sub.objectValue else { throw .protocolViolation("delta \"sub\" is not an object") }
            for (k, nested) in fields {
                guard case .object(let inner) = out[k] else {
                    throw .protocolViolation("delta descends into \"\(k)\", which is not an object in the base")
                }
                out[k] = .object(try apply(nested, to: inner))
            }
        }
        return out
    }
}

import FerryCore
import FerryQuery

/// An access rule written down whole, the group's grant included, so that what a reader was
/// allowed when it last synced can be judged again later (an app's pull checkpoint keeps the
/// read rule its changes were judged by). Unlike the config file's form (`AccessRule.json`
/// in FerryNode), nothing is left out: `{"prefixes","ids","types","grant"?}`, a grant being
/// `{"clauses":[{"ids","selector"?}],"also":[grant…]}`.
extension AccessRule {
    public var record: JSON {
        var o: [String: JSON] = [
            "prefixes": .array(idPrefixes.map { .string($0) }), "ids": .array(idPatterns.map { .string($0) }),
            "types": .array(types.map { .string($0) }),
        ]
        if let grant { o["grant"] = grant.record }
        return .object(o)
    }

    /// Reads a rule written by `record`; throws on anything else.
    public init(record: JSON) throws(SyncError) {
        guard let o = record.objectValue else { throw .protocolViolation("an access rule record is not an object") }
        self.init(
            idPrefixes: try Self.strings(o["prefixes"], "prefixes"), idPatterns: try Self.strings(o["ids"], "ids"),
            types: try Self.strings(o["types"], "types"), grant: try o["grant"].map { g throws(SyncError) in try AccessGrant(record: g) })
    }

    static func strings(_ value: JSON?, _ name: String) throws(SyncError) -> [String] {
        guard let value else { return [] }
        guard case .array(let items) = value else { throw .protocolViolation("an access rule record's \(name) is not a list") }
        var out: [String] = []
        for item in items {
            guard let s = item.stringValue else { throw .protocolViolation("an access rule record's \(name) holds a non-string") }
            out.append(s)
        }
        return out
    }
}

extension AccessGrant {
    public var record: JSON {
        var clauseRecords: [JSON] = []
        for clause in clauses {
            var c: [String: JSON] = ["ids": .array(clause.idPatterns.map { .string($0) })]
            if let selector = clause.selectorJSON { c["selector"] = selector }
            clauseRecords.append(.object(c))
        }
        return ["clauses": .array(clauseRecords), "also": .array(also.map(\.record))]
    }

    public init(record: JSON) throws(SyncError) {
        guard let o = record.objectValue, case .array(let clauseRecords)? = o["clauses"] else {
            throw .protocolViolation("an access grant record lacks its clauses")
        }
        var clauses: [AccessClause] = []
        for c in clauseRecords {
            guard let fields = c.objectValue else { throw .protocolViolation("an access clause record is not an object") }
            let ids = try AccessRule.strings(fields["ids"], "ids")
            do { clauses.append(try AccessClause(idPatterns: ids, selector: fields["selector"])) } catch {
                throw .protocolViolation("an access clause record's selector is invalid: \(error)")
            }
        }
        var also: [AccessGrant] = []
        if let a = o["also"] {
            guard case .array(let items) = a else { throw .protocolViolation("an access grant record's also is not a list") }
            for item in items { also.append(try AccessGrant(record: item)) }
        }
        self.init(clauses: clauses, also: also)
    }
}

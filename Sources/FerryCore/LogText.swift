/// Makes text that came from another node (hello fields, request profiles, error reasons,
/// document and revision IDs, DNS-SD names and TXT values) safe to put in a log line.
///
/// A log line is one line of plain text: a peer that could put a newline in it could forge
/// whole log lines, and one that could put ANSI escape codes in it could rewrite the
/// operator's terminal. `escape` keeps printable text as it is and writes every control or
/// invisible formatting character as a visible escape, so the line reads back unambiguously.
public enum LogText {
    /// The text with `\` doubled, newline, carriage return and tab as `\n`, `\r`, `\t`,
    /// and every other control, format (bidirectional overrides, zero-width characters) or
    /// line/paragraph-separator scalar as `\u{XXXX}`.
    public static func escape(_ text: some StringProtocol) -> String {
        // Most peer text is plain: return it unchanged without building a new string.
        if !text.unicodeScalars.contains(where: needsEscape) { return String(text) }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if needsEscape(scalar) {
                    out += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    /// The description of a value (typically an error carrying a peer's reason), escaped.
    public static func escape(describing value: Any) -> String { escape(String(describing: value)) }

    static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        if scalar == "\\" || isControl(scalar) { return true }
        switch scalar.properties.generalCategory {
        case .surrogate, .privateUse, .unassigned: return true
        default: return false
        }
    }

    /// Whether a scalar is a control (C0, DEL, C1), a format character (bidirectional
    /// overrides, zero-width characters) or a line or paragraph separator.
    public static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        if scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) { return true }
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator: return true
        default: return false
        }
    }
}

/// The rule for names given to nodes (a node's own name, a trust entry's): printable text,
/// without the control and format characters that could forge lines or disguise text
/// wherever a name is shown (terminals, logs, certificates, DNS-SD).
public enum NodeName {
    /// The name a node gets when none is given: the host's name, followed by its data
    /// directory's name unless that is the usual one (`ferry-data`, `ferry`), so that two
    /// nodes on one machine are told apart in every listing (`vm`, `vm-node-b`).
    public static func defaultName(host: String, dataDirectory: String) -> String {
        var path = Substring(dataDirectory)
        while path.count > 1, path.hasSuffix("/") { path = path.dropLast() }
        let base = path.split(separator: "/").last.map(String.init) ?? ""
        guard !["", ".", "..", "ferry-data", "ferry"].contains(base) else { return host }
        let cleaned = String(String.UnicodeScalarView(base.unicodeScalars.map { LogText.isControl($0) || $0 == " " ? "-" : $0 }))
        return "\(host)-\(cleaned)"
    }

    /// Throws unless `name` is free of control and format characters (`LogText.isControl`).
    public static func validate(_ name: String) throws(NodeNameError) {
        if let bad = name.unicodeScalars.first(where: LogText.isControl) {
            throw NodeNameError(name: name, scalar: bad)
        }
    }
}

/// A name holding a control or format character.
public struct NodeNameError: FerryError, Equatable {
    public let name: String
    public let scalar: Unicode.Scalar
    public var domain: String { "core" }
    public var code: String { "bad_name" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String { "name \"\(LogText.escape(name))\" \(reason)" }
    /// What is wrong, without the name.
    public var reason: String {
        let hex = String(scalar.value, radix: 16, uppercase: true)
        return "contains the control character U+\(String(repeating: "0", count: max(0, 4 - hex.count)) + hex); use printable text"
    }
}

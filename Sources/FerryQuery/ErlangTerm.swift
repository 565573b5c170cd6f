import FerryCore
import Foundation

/// Renders JSON values the way CouchDB's error reasons print them: as the Erlang terms its
/// JSON decoder makes (`<<"a">>` for a string, `{[{<<"k">>,1}]}` for an object), with `~w`
/// (strings as byte lists, `<<97>>`) or `~p` (printable strings quoted).
enum ErlangTerm {
    static func render(_ value: JSON, pretty: Bool) -> String {
        switch value {
        case .null: return "null"
        case .bool(let b): return b ? "true" : "false"
        case .int(let i): return String(i)
        case .double(let d): return float(d)
        case .string(let s): return binary(s, pretty: pretty)
        case .array(let items):
            if pretty, !items.isEmpty, let text = printableList(items) { return text }
            return "[" + items.map { render($0, pretty: pretty) }.joined(separator: ",") + "]"
        case .object(let members):
            let keys = members.keys.sorted(by: CouchCollation.utf8Precedes)
            let pairs = keys.map { "{" + binary($0, pretty: pretty) + "," + render(members[$0]!, pretty: pretty) + "}" }
            return "{[" + pairs.joined(separator: ",") + "]}"
        }
    }

    private static func binary(_ s: String, pretty: Bool) -> String {
        let bytes = Array(s.utf8)
        if pretty, !bytes.isEmpty, bytes.allSatisfy({ (0x20...0x7E).contains($0) }) {
            return "<<\"" + escaped(s) + "\">>"
        }
        return "<<" + bytes.map(String.init).joined(separator: ",") + ">>"
    }

    /// `~p` prints a list of printable character codes as a string.
    private static func printableList(_ items: [JSON]) -> String? {
        var text = ""
        for item in items {
            guard case .int(let i) = item, (0x20...0x7E).contains(i), let scalar = Unicode.Scalar(UInt32(i)) else {
                return nil
            }
            text.unicodeScalars.append(scalar)
        }
        return "\"" + escaped(text) + "\""
    }

    private static func escaped(_ s: String) -> String {
        s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
    }

    /// Erlang prints the shortest round-trip digits, always with a `.0` mantissa fraction and
    /// an `e` exponent without `+` or leading zeros.
    private static func float(_ d: Double) -> String {
        let text = "\(d)"
        guard let e = text.firstIndex(where: { $0 == "e" || $0 == "E" }) else {
            return text.contains(".") ? text : text + ".0"
        }
        var mantissa = String(text[..<e])
        if !mantissa.contains(".") { mantissa += ".0" }
        var exponent = String(text[text.index(after: e)...])
        var sign = ""
        if exponent.hasPrefix("+") { exponent.removeFirst() } else if exponent.hasPrefix("-") {
            sign = "-"
            exponent.removeFirst()
        }
        while exponent.count > 1 && exponent.hasPrefix("0") { exponent.removeFirst() }
        return mantissa + "e" + sign + exponent
    }
}

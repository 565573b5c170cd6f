import FerryCore

/// A parsed CouchDB Mango selector that decides whether a document matches.
public struct MangoSelector: Sendable, Hashable {
    /// The normalised selector tree (see `SelectorNode`).
    public let root: SelectorNode

    /// Parses a selector object; a malformed one throws with CouchDB's reason.
    public init(parsing value: JSON) throws(MangoError) {
        root = try SelectorParser.parse(selector: value)
    }

    /// Wraps an already normalised tree.
    public init(root: SelectorNode) { self.root = root }

    /// The selector `{}`, which every document matches.
    public static let matchAll = MangoSelector(root: .matchAll)

    /// Whether `document` (its CouchDB JSON, with `_id`, `_rev`, …) matches; false when a
    /// `$regex` test exceeds its budget.
    public func matches(_ document: JSON) -> Bool { root.matches(document) }

    /// Whether `document` matches; throws `regexTooCostly` when a `$regex` test exceeds
    /// `QueryLimits.maximumRegexTicks`, so a query can say why it stopped.
    public func evaluate(_ document: JSON) throws(MangoError) -> Bool { try root.evaluate(document) }

    /// The top-level members of a document this selector reads: a document holding only
    /// these (the others left out) matches exactly when the whole document does. Nil when a
    /// condition applies to the document itself.
    public var topLevelMembers: Set<String>? {
        var names = Set<String>()
        func collect(_ node: SelectorNode) -> Bool {
            switch node {
            case .matchAll: return true
            case .and(let clauses), .or(let clauses), .nor(let clauses): return clauses.allSatisfy(collect)
            case .not(let inner): return collect(inner)
            case .field(let path, _):
                guard let first = path.components.first else { return false }
                names.insert(first)
                return true
            }
        }
        return collect(root) ? names : nil
    }
}

/// A selector or query CouchDB would refuse, with the error name and reason it gives (all 400).
public enum MangoError: FerryError, Equatable {
    /// `invalid_selector`: the selector as a whole is malformed.
    case invalid(String)
    /// `bad_arg`: an operator's argument has the wrong type or value.
    case badArgument(operator: String, argument: JSON)
    /// `invalid_operator`: a `$`-key that is no operator.
    case invalidOperator(String)
    /// `not_supported`: an operator CouchDB knows but Ferry does not evaluate (`$text`, `$where`, geo).
    case unsupportedOperator(String)
    /// `invalid_selector`: a condition with no field to apply to, such as `{"$gt": 1}`.
    case missingFieldName
    /// `invalid_field_name`: an empty path component, as in `a..b`.
    case invalidFieldName(String)
    /// `invalid_selector`: nested deeper than Ferry evaluates.
    case tooDeep(limit: Int)
    /// A `_find` request field with a bad value; `error` is CouchDB's error name for it.
    case invalidQuery(error: String, reason: String)
    /// `bad_request`: the selector exceeds one of `QueryLimits`, named in the reason.
    case limitExceeded(String)
    /// `bad_request`: a `$regex` test took more than `QueryLimits.maximumRegexTicks`.
    case regexTooCostly(pattern: String)

    public var domain: String { "query" }
    public var isTransient: Bool { false }
    public var failure: FailureKind { .invalidRequest }

    /// CouchDB's error name, for the `error` member of the response.
    public var code: String {
        switch self {
        case .invalid, .missingFieldName, .tooDeep: return "invalid_selector"
        case .badArgument: return "bad_arg"
        case .invalidOperator: return "invalid_operator"
        case .unsupportedOperator: return "not_supported"
        case .invalidFieldName: return "invalid_field_name"
        case .invalidQuery(let error, _): return error
        case .limitExceeded, .regexTooCostly: return "bad_request"
        }
    }

    /// CouchDB's reason, for the `reason` member of the response.
    public var description: String {
        switch self {
        case .invalid(let why): return why
        case .badArgument(let op, let arg): return "Bad argument for operator \(op): \(arg.canonicalString)"
        case .invalidOperator(let op): return "Invalid operator: \(op)"
        case .unsupportedOperator(let op): return "Unsupported operator: \(op)"
        case .missingFieldName: return "One or more conditions is missing a field name."
        case .invalidFieldName(let name): return "Invalid field name: \(name)"
        case .tooDeep(let limit): return "Selector is nested more than \(limit) levels deep."
        case .invalidQuery(_, let reason): return reason
        case .limitExceeded(let reason): return reason
        case .regexTooCostly(let pattern):
            return "$regex \(JSON.string(pattern).canonicalString) needed more than \(QueryLimits.maximumRegexTicks * 10_000) "
                + "matching steps on one value (limit maximumRegexTicks); nested repetition such as (a+)+ backtracks "
                + "exponentially: write the pattern without it."
        }
    }
}

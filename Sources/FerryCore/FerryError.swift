/// What every Ferry error tells its caller: where it came from, which one it is,
/// and whether trying again may help.
public protocol FerryError: Error, CustomStringConvertible, Sendable {
    /// The subsystem that raised the error, e.g. `"store"` or `"core"`.
    var domain: String { get }
    /// A stable, machine-readable name for the error, e.g. `"conflict"`.
    var code: String { get }
    /// True when the same operation may succeed later without any change by the caller.
    var isTransient: Bool { get }
}

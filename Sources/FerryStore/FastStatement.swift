import GRDB
import GRDBSQLite

/// Binds and steps a cached GRDB statement through the SQLite C API.
///
/// Used only on the per-document hot path (save and lookup): GRDB's argument boxing
/// and row wrappers cost about a fifth of a save there. Everything else uses GRDB.
struct FastStatement {
    let statement: Statement
    var raw: OpaquePointer { statement.sqliteStatement }
    let db: Database

    init(_ db: Database, sql: String) throws {
        try self.init(db, statement: db.cachedStatement(sql: sql))
    }

    init(_ db: Database, statement: Statement) {
        self.db = db
        self.statement = statement
        sqlite3_reset(raw)
        sqlite3_clear_bindings(raw)
    }

    static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    func bind(_ index: Int32, _ text: String) {
        var t = text
        t.withUTF8 { buf in
            _ = sqlite3_bind_text(raw, index, UnsafeRawPointer(buf.baseAddress!).assumingMemoryBound(to: CChar.self), Int32(buf.count), Self.transient)
        }
    }

    func bind(_ index: Int32, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buf in
            _ = sqlite3_bind_blob(raw, index, buf.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buf.count), Self.transient)
        }
    }

    func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(raw, index, value) }
    func bind(_ index: Int32, _ value: Bool) { sqlite3_bind_int64(raw, index, value ? 1 : 0) }

    /// Steps once; true if a row is available.
    func step() throws -> Bool {
        let code = sqlite3_step(raw)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let message = String(cString: sqlite3_errmsg(sqlite3_db_handle(raw)))
            sqlite3_reset(raw)
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: statement.sql)
        }
    }

    /// Runs a statement that returns no rows.
    func run() throws {
        _ = try step()
        sqlite3_reset(raw)
    }

    func done() { sqlite3_reset(raw) }

    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(raw, column) }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(raw, column) == SQLITE_NULL }

    func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(raw, column) else { return "" }
        let n = Int(sqlite3_column_bytes(raw, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    func bytes(_ column: Int32) -> [UInt8] {
        let n = Int(sqlite3_column_bytes(raw, column))
        guard n > 0, let p = sqlite3_column_blob(raw, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }
}

import GRDB

/// The store's append-only, named migrations. Never edit a shipped migration; add one.
enum Schema {
    static func migrator() -> DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1-documents") { db in
            try db.execute(
                sql: """
                    CREATE TABLE store_state (
                        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
                        uuid TEXT NOT NULL CHECK (length(uuid) = 36),
                        last_sequence INTEGER NOT NULL CHECK (last_sequence >= 0),
                        last_hlc INTEGER NOT NULL
                    );
                    INSERT INTO store_state (singleton, uuid, last_sequence, last_hlc)
                        VALUES (1, lower(
                            hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
                            substr(hex(randomblob(2)), 2) || '-' ||
                            substr('89ab', 1 + (abs(random()) % 4), 1) ||
                            substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6))), 0, 0);

                    -- One row per document: the winning revision's body, and the rest of the
                    -- revision tree in a compact binary encoding (FerryCore.RevisionTree).
                    CREATE TABLE documents (
                        doc_key INTEGER PRIMARY KEY,
                        id TEXT NOT NULL UNIQUE CHECK (length(id) > 0),
                        rev TEXT NOT NULL,
                        deleted INTEGER NOT NULL CHECK (deleted IN (0, 1)),
                        conflicted INTEGER NOT NULL CHECK (conflicted IN (0, 1)),
                        sequence INTEGER NOT NULL UNIQUE CHECK (sequence > 0),
                        body BLOB NOT NULL,
                        tree BLOB NOT NULL
                    );
                    CREATE INDEX documents_conflicted ON documents (id) WHERE conflicted = 1;

                    -- Never replicated: checkpoints and node state.
                    CREATE TABLE local_documents (
                        id TEXT PRIMARY KEY NOT NULL CHECK (length(id) > 0),
                        body BLOB NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        return m
    }
}

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
        m.registerMigration("v2-mango-indexes") { db in
            try db.execute(
                sql: """
                    -- Mango JSON indexes that design documents define. `definition` is the
                    -- canonical JSON of the view (a changed one is a new index); `key_version`
                    -- is the key layout the entries were computed with (MangoIndexKeys.version).
                    -- Progress counts document rows walked by doc_key, deleted ones included.
                    CREATE TABLE mango_indexes (
                        index_id INTEGER PRIMARY KEY AUTOINCREMENT,
                        ddoc TEXT NOT NULL,
                        name TEXT NOT NULL,
                        definition BLOB NOT NULL,
                        state TEXT NOT NULL CHECK (state IN ('building', 'ready', 'dropping')),
                        build_cursor INTEGER NOT NULL DEFAULT 0,
                        build_done INTEGER NOT NULL DEFAULT 0,
                        build_total INTEGER NOT NULL DEFAULT 0,
                        key_version INTEGER NOT NULL
                    );
                    CREATE INDEX mango_indexes_by_ddoc ON mango_indexes (ddoc, name);

                    -- One entry per (index, live document in it): identified by the document's
                    -- row, so removing an entry never needs its old key; read in (key, doc_id) order.
                    CREATE TABLE mango_entries (
                        index_id INTEGER NOT NULL,
                        doc_key INTEGER NOT NULL,
                        key BLOB NOT NULL,
                        doc_id TEXT NOT NULL,
                        PRIMARY KEY (index_id, doc_key)
                    ) WITHOUT ROWID;
                    CREATE INDEX mango_entries_by_key ON mango_entries (index_id, key, doc_id);
                    """)
        }
        return m
    }
}

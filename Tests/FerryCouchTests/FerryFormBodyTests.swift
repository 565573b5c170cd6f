import FerryCore
import FerryStore
import Foundation
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// A Ferry-form revision that came back through a CouchDB server with re-encoded attachment digests.
@Suite struct FerryFormBodyTests {
    @Test func aBodyWhoseAttachmentDigestsAServerReencodedIsMatchedToItsRevisionAgain() throws {
        let store = try DocumentStore.inMemory()
        let text = Array(String(repeating: "ward 3, bed 12: observations\n", count: 40).utf8)
        let att = StoredAttachment(bytes: text, contentType: "text/plain", revpos: 1)
        let original: JSON = ["kind": "note", .init(StoredAttachment.bodyKey): .object(["notes.txt": att.json])]
        let rev = RevisionID.compute(parent: nil, deleted: false, canonicalBody: original.canonicalBytes)
        // The server's digest: the MD5 of the gzip-encoded bytes it keeps.
        var reencoded = att
        reencoded.md5 = StoredAttachment.md5Digest(try #require(Gzip.encode(text)))
        let back: JSON = ["kind": "note", .init(StoredAttachment.bodyKey): .object(["notes.txt": reencoded.json])]
        #expect(back != original)
        let matched = FerryFormBody.matching(rev, parent: nil, deleted: false, body: back, contents: [text], blobs: store.blobs)
        #expect(matched == original)
        // From the blob store when the bytes did not come with the document.
        try store.blobs.put(text)
        #expect(FerryFormBody.matching(rev, parent: nil, deleted: false, body: back, contents: [], blobs: store.blobs) == original)
        // A body that differs in anything else still does not match.
        let edited: JSON = ["kind": "edited", .init(StoredAttachment.bodyKey): .object(["notes.txt": reencoded.json])]
        let unmatched = FerryFormBody.matching(rev, parent: nil, deleted: false, body: edited, contents: [text], blobs: store.blobs)
        #expect(unmatched.map { _ in true } == nil)
    }
}

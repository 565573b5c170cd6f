import Testing
@testable import FerryCore

@Suite struct ForeignRevisionIDTests {
    let md5 = "9c65296036141e575d32ba9c034dd3ee"

    @Test func aCouchDBRevisionIDIsAcceptedAndServedLowercase() throws {
        let r = try RevisionID("3-" + md5.uppercased())
        #expect(r.description == "3-" + md5)
        #expect(r.generation == 3)
        #expect(r.form == .hex32)
        #expect(!r.isFerryDigest)
        #expect(r.hashText == md5)
        #expect(r == (try RevisionID("3-" + md5)))
        #expect(r.collationBytes == Hex.decode(md5))
        #expect(r.ferryDigestBytes == nil)
    }

    @Test func otherHashesAreKeptAsGiven() throws {
        let sha1 = "2bcbc4e0e5c5e5c9b12a38b4c5e8f1c8d0b9a7e1"
        for hash in ["a", "Zz.._~+/=-x", sha1, String(repeating: "q", count: 128), "1-2-3", String(repeating: "AB", count: 32)] {
            let r = try RevisionID("12-" + hash)
            #expect(r.description == "12-" + hash)
            #expect(r.hashText == hash)
            #expect(r.form == .text, "\(hash)")
            #expect(r.collationBytes == Array(hash.utf8))
        }
    }

    @Test func aSixteenCharacterHashIsReadAsTheSixteenBytesCouchDBStores() throws {
        // CouchDB keeps a 32-hex hash as 16 bytes and prints any 16-byte hash as hex.
        let r = try RevisionID("1-abcdefghijklmnop")
        #expect(r.description == "1-6162636465666768696a6b6c6d6e6f70")
        #expect(r.form == .hex32)
        #expect(r == (try RevisionID("1-6162636465666768696A6B6C6D6E6F70")))
    }

    @Test func badRevisionIDsAreRefusedNamingTheAcceptedForms() throws {
        let bad = [
            "", "1", "1-", "-", "-1-abc", "0-abc", "00-abc", "x-abc", "+1-abc", " 1-abc", "1-a b", "1-é", "1-a\n",
            "2147483648-abc", "99999999999999999999-abc", "1-" + String(repeating: "q", count: 129),
            "1-" + String(repeating: "g", count: 32), "1-" + String(repeating: "a", count: 31) + "!", "1-abc;",
        ]
        for text in bad {
            #expect(throws: RevisionIDError.self, "\(text)") { try RevisionID(text) }
        }
        let error = try #require(throws: RevisionIDError.self) { try RevisionID("1-nöt") }
        #expect(error.description.contains("64 lowercase hex digits (Ferry)"))
        #expect(error.description.contains("32 hex digits (CouchDB)"))
        #expect(error.description.contains("1 to 128"))
        #expect(throws: RevisionIDError.self) { try RevisionID(generation: 0, hash: md5) }
        #expect(throws: RevisionIDError.self) { try RevisionID(generation: 1, hash: "") }
        #expect(try RevisionID(generation: 4, hash: md5.uppercased()).description == "4-" + md5)
    }

    @Test func aLongBadRevisionIDIsCutShortInItsError() throws {
        let error = try #require(throws: RevisionIDError.self) { try RevisionID(String(repeating: "x", count: 10_000)) }
        #expect(error.description.utf8.count < 600)
    }

    @Test func leadingZerosOfTheGenerationAreDroppedForEveryForm() throws {
        for hash in [md5, String(repeating: "e", count: 64), "abc"] {
            let r = try RevisionID("0009-" + hash)
            #expect(r.generation == 9)
            #expect(r.description == "9-" + hash)
        }
    }

    @Test func ferryFormHasNoOtherSpelling() throws {
        let ferry = RevisionID.compute(parent: nil, deleted: false, canonicalBody: Array(#"{"a":1}"#.utf8))
        #expect(ferry.isFerryDigest)
        // Upper or mixed case is a different, unverifiable ID, never the Ferry revision.
        let upper = try RevisionID("1-" + ferry.hashText.uppercased())
        #expect(upper != ferry)
        #expect(!upper.isFerryDigest)
        #expect(upper.description == "1-" + ferry.hashText.uppercased())
        // A zero-padded generation is the same ID, so in Ferry's form, so verified.
        let padded = try RevisionID("01-" + ferry.hashText)
        #expect(padded == ferry)
        #expect(padded.isFerryDigest)
        // A Ferry-form ID sorts and hashes as one value whatever the spelling it was read from.
        #expect(Set([padded, ferry]).count == 1)
    }

    @Test func aChildOfAForeignRevisionGetsAFerryDigestOverTheParentText() throws {
        let parent = try RevisionID("2-" + md5)
        let child = RevisionID.compute(parent: parent, deleted: false, canonicalBody: Array("{}".utf8))
        #expect(child.generation == 3)
        #expect(child.isFerryDigest)
        let otherParent = try RevisionID("2-" + String(md5.reversed()))
        let other = RevisionID.compute(parent: otherParent, deleted: false, canonicalBody: Array("{}".utf8))
        #expect(child != other)
    }

    @Test func aThirtyTwoHexHashSortsAsItsBytesAgainstText() throws {
        // Each pair would sort the other way if the hashes compared as text.
        let high = try RevisionID("5-" + md5)  // first byte 0x9c
        let upper = try RevisionID("5-A")  // 0x41
        #expect(upper < high)
        #expect(!(high < upper))
        let low = try RevisionID("5-0a" + String(repeating: "0", count: 30))  // first byte 0x0a
        let zero = try RevisionID("5-0")  // 0x30
        #expect(low < zero)
        // Bytes equal up to the shorter: the proper prefix sorts first.
        let prefix = try RevisionID("5-" + "41" + String(repeating: "0", count: 30))  // "A" then 15 zero bytes
        #expect(upper < prefix)
        #expect(try RevisionID("5-ab") < (try RevisionID("5-abc")))
        // A higher generation wins whatever the hash.
        #expect(high < (try RevisionID("6-0")))
    }
}

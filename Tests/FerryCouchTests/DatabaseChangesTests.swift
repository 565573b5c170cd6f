import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import IntegrationHarness
import Testing

/// `_changes` feeds over the router test client. A feed's request is a task of its own: at the
/// start of a parallel run it may wait for the cooperative pool behind the first burst of
/// other suites (34 s seen on a fresh CI clone), so each wait for the feed allows two minutes
/// (the test ends as soon as the feed gets there).
@Suite struct DatabaseChangesTests {
    @Test func normalFeedListsEachDocumentOnceAtItsLatestSequence() async throws {
        let f = try DatabaseFixture()
        let a1 = try f.put("a", ["n": 1])
        try f.put("b", ["n": 1])
        let a2 = try f.put("a", ["n": 2], parent: a1)
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes")
            #expect(r.status == 200)
            #expect(r.ids == ["b", "a"])
            #expect(r.results.map { $0["seq"] } == [2, 3])
            #expect(r.results[1]["changes"] == [["rev": .string(a2.description)]])
            #expect(r["last_seq"] == 3)
            #expect(r["pending"] == 0)
            #expect(try await c.get("/ferry/_changes?since=2").ids == ["a"])
            #expect(try await c.get("/ferry/_changes?since=%222%22").ids == ["a"])
            let now = try await c.get("/ferry/_changes?since=now")
            #expect(now.results.isEmpty)
            #expect(now["last_seq"] == 3)
        }
    }

    @Test func limitEndsAtTheLastListedChangeWithWhatIsPending() async throws {
        let f = try DatabaseFixture()
        for id in ["a", "b", "c"] { try f.put(id, ["n": 1]) }
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes?limit=2")
            #expect(r.ids == ["a", "b"])
            #expect(r["last_seq"] == 2)
            #expect(r["pending"] == 1)
            let next = try await c.get("/ferry/_changes?since=\(r["last_seq"]!.intValue!)")
            #expect(next.ids == ["c"])
            let none = try await c.get("/ferry/_changes?since=1&limit=0")
            #expect(none.results.isEmpty)
            #expect(none["last_seq"] == 1)
            #expect(none["pending"] == 2)
            #expect(try await c.get("/ferry/_changes?descending=true&limit=0").results.isEmpty)
            #expect(try await c.get("/ferry/_changes?feed=continuous&limit=0").lines == [#"{"last_seq":0,"pending":3}"#, ""])
        }
    }

    @Test func malformedOptionsAreBadRequestsNamingTheParameter() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            for (query, name) in [
                ("since=xyz", "since"), ("since=-1", "since"), ("limit=abc", "limit"), ("feed=bogus", "feed"),
                ("style=most", "style"), ("include_docs=yes", "include_docs"), ("heartbeat=soon", "heartbeat"),
                ("timeout=-5", "timeout"), ("descending=1", "descending"),
            ] {
                let r = try await c.get("/ferry/_changes?" + query)
                #expect(r.status == 400, "\(query)")
                #expect(r.error == "bad_request")
                #expect(r["reason"]?.stringValue?.contains(name) == true, "\(query): \(r.text)")
            }
        }
    }

    @Test func styleAllDocsListsEveryLeafAndConflictsShowInDocs() async throws {
        let f = try DatabaseFixture()
        let revs = try f.conflict("x", ["v": 1], ["v": 2])
        let winner = try f.store.document(DocumentID(unchecked: "x"))!.revision
        let loser = revs.first { $0 != winner }!
        try await f.test { c async throws in
            let main = try await c.get("/ferry/_changes")
            #expect(main.results[0]["changes"] == [["rev": .string(winner.description)]])
            let all = try await c.get("/ferry/_changes?style=all_docs")
            #expect(all.results[0]["changes"] == [["rev": .string(winner.description)], ["rev": .string(loser.description)]])
            let docs = try await c.get("/ferry/_changes?include_docs=true&conflicts=true")
            #expect(docs.results[0]["doc"]?["_conflicts"] == [.string(loser.description)])
        }
    }

    @Test func includeDocsCarriesBodiesAndDeletionsAreMarked() async throws {
        let f = try DatabaseFixture()
        let rev = try f.put("a", ["n": 1])
        try f.put("b", ["n": 2])
        let gone = try f.store.delete(DocumentID(unchecked: "a"), revision: rev)
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes?include_docs=true")
            #expect(r.ids == ["b", "a"])
            #expect(r.results[0]["doc"]?["n"] == 2)
            #expect(r.results[0]["doc"]?["_id"] == "b")
            #expect(r.results[0]["deleted"] == nil)
            #expect(r.results[1]["deleted"] == true)
            #expect(r.results[1]["doc"]?["_deleted"] == true)
            #expect(r.results[1]["doc"]?["_rev"] == .string(gone.description))
            #expect(try await c.get("/ferry/_changes").results[0]["doc"] == nil)
        }
    }

    @Test func descendingListsNewestFirstBeforeSince() async throws {
        let f = try DatabaseFixture()
        for id in ["a", "b", "c"] { try f.put(id, ["n": 1]) }
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes?descending=true")
            #expect(r.ids == ["c", "b", "a"])
            #expect(r["last_seq"] == 1)
            let limited = try await c.get("/ferry/_changes?descending=true&limit=1")
            #expect(limited.ids == ["c"])
            #expect(limited["pending"] == 2)
            #expect(try await c.get("/ferry/_changes?descending=true&since=3").ids == ["b", "a"])
        }
    }

    @Test func docIDsFilterTakesTheListFromTheQueryOrTheBody() async throws {
        let f = try DatabaseFixture()
        for id in ["a", "b", "c"] { try f.put(id, ["n": 1]) }
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_changes?filter=_doc_ids&doc_ids=%5B%22c%22,%22a%22%5D").ids == ["a", "c"])
            #expect(try await c.post("/ferry/_changes?filter=_doc_ids", #"{"doc_ids":["b"]}"#).ids == ["b"])
            let bad = try await c.post("/ferry/_changes?filter=_doc_ids", #"{"doc_ids":"b"}"#)
            #expect(bad.status == 400)
            #expect(try await c.get("/ferry/_changes?filter=_doc_ids").status == 400)
        }
    }

    @Test func selectorFilterListsMatchingDocuments() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["type": "fruit"])
        try f.put("b", ["type": "tool"])
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_changes?filter=_selector", #"{"selector":{"type":"tool"}}"#)
            #expect(r.status == 200)
            #expect(r.ids == ["b"])
            #expect(r["last_seq"] == 2)
            #expect(try await c.post("/ferry/_changes?filter=_selector", #"{"selector":5}"#).status == 400)
            #expect(try await c.post("/ferry/_changes?filter=_selector", "{}").status == 400)
        }
    }

    @Test func designFilterAndJavaScriptFilters() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try f.put("_design/app", ["filters": ["mine": "function(doc, req) { return true; }"]])
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_changes?filter=_design").ids == ["_design/app"])
            let missing = try await c.get("/ferry/_changes?filter=other/mine")
            #expect(missing.status == 404)
            #expect(missing["reason"] == "missing")
            #expect(try await c.get("/ferry/_changes?filter=app/nothing").status == 404)
            let js = try await c.get("/ferry/_changes?filter=app/mine")
            #expect(js.status == 400)
            #expect(js["reason"]?.stringValue?.contains("JavaScript") == true)
            #expect(try await c.get("/ferry/_changes?filter=nonsense").status == 400)
        }
    }

    @Test func aPrincipalNeverSeesDocumentsItsReadRuleExcludes() async throws {
        let f = try DatabaseFixture()
        try f.put("pub/a", ["n": 1])
        try f.put("secret", ["n": 2])
        try f.put("pub/b", ["n": 3])
        let reader = CouchPrincipal.user(name: "r", policy: PeerPolicy(read: AccessRule(idPrefixes: ["pub/"])))
        try await f.test(as: reader) { c async throws in
            let r = try await c.get("/ferry/_changes?include_docs=true")
            #expect(r.ids == ["pub/a", "pub/b"])
            #expect(r["last_seq"] == 3)
            #expect(try await c.get("/ferry/_all_docs").ids == ["pub/a", "pub/b"])
            #expect(try await c.post("/ferry/_all_docs", #"{"keys":["secret"]}"#).rows[0]["error"] == "not_found")
        }
    }

    @Test func longpollWaitsForAWriteAndAnswersWithIt() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try await f.test { c async throws in
            async let answer = c.get("/ferry/_changes?feed=longpoll&since=now&timeout=600000")
            try await waitUntil("the longpoll waits for a commit", timeout: 120, every: .milliseconds(5)) { f.store.commitWaiters > 0 }
            try f.put("b", ["n": 2])
            let r = try await answer
            #expect(r.ids == ["b"])
            #expect(r["last_seq"] == 2)
        }
    }

    @Test func longpollKeepsWaitingThroughChangesItsFilterExcludes() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            async let answer = c.post("/ferry/_changes?feed=longpoll&filter=_doc_ids&timeout=600000", #"{"doc_ids":["wanted"]}"#)
            try await waitUntil("the longpoll waits", timeout: 120, every: .milliseconds(5)) { f.store.commitWaiters > 0 }
            try f.put("other", ["n": 1])
            try await waitUntil("the longpoll waits again", timeout: 120, every: .milliseconds(5)) { f.store.commitWaiters > 0 }
            try f.put("wanted", ["n": 2])
            let r = try await answer
            #expect(r.ids == ["wanted"])
            #expect(r["last_seq"] == 2)
        }
    }

    @Test func longpollEndsAfterItsTimeoutWithNoResults() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes?feed=longpoll&since=now&timeout=20&heartbeat=5")
            #expect(r.status == 200)
            #expect(r.results.isEmpty)
            #expect(r["last_seq"] == 1)
            // Returns at once when there is something to list.
            #expect(try await c.get("/ferry/_changes?feed=longpoll&since=0&timeout=600000").ids == ["a"])
        }
    }

    @Test func continuousFeedStreamsAWriteAndEndsAtItsLimit() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try await f.test { c async throws in
            async let answer = c.get("/ferry/_changes?feed=continuous&since=0&limit=2&heartbeat=600000")
            try await waitUntil("the feed waits for a commit", timeout: 120, every: .milliseconds(5)) { f.store.commitWaiters > 0 }
            try f.put("b", ["n": 2])
            let r = try await answer
            let lines = r.lines.filter { !$0.isEmpty }.map { try? JSON.parse(String($0)) }
            #expect(lines.count == 3)
            #expect(lines[0]?["id"] == "a")
            #expect(lines[1]?["id"] == "b")
            #expect(lines[2]?["last_seq"] == 2)
            #expect(lines[2]?["pending"] == 0)
        }
    }

    @Test func continuousFeedSendsHeartbeatsWhileIdleAndEndsOnItsTimeout() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        let clock = ManualClock()
        var database = f.database
        database.clock = clock
        try await f.test(database: database) { c async throws in
            async let answer = c.get("/ferry/_changes?feed=continuous&since=now&heartbeat=1000&timeout=2500")
            for _ in 0..<2 {
                try await waitUntil("the feed sleeps until its next heartbeat", timeout: 120, every: .milliseconds(5)) {
                    clock.pendingDeadlines.contains(clock.now.offset + .milliseconds(1000))
                }
                clock.advance(by: .milliseconds(1000))
            }
            try await waitUntil("the feed sleeps until its timeout", timeout: 120, every: .milliseconds(5)) {
                clock.pendingDeadlines.contains(clock.now.offset + .milliseconds(500))
            }
            clock.advance(by: .milliseconds(500))
            let r = try await answer
            #expect(r.lines == ["", "", #"{"last_seq":1,"pending":0}"#, ""], "\(r.text.debugDescription)")
        }
    }

    @Test func changesTheFilterExcludesDoNotPostponeHeartbeats() async throws {
        let f = try DatabaseFixture()
        let clock = ManualClock()
        var database = f.database
        database.clock = clock
        try await f.test(database: database) { c async throws in
            async let answer = c.get(
                "/ferry/_changes?feed=continuous&filter=_doc_ids&doc_ids=%5B%22x%22%5D&heartbeat=1000&limit=1")
            try await waitUntil("the feed waits", timeout: 120, every: .milliseconds(5)) {
                f.store.commitWaiters > 0 && clock.pendingDeadlines == [.milliseconds(1000)]
            }
            clock.advance(by: .milliseconds(600))
            try f.put("other", ["n": 1])
            try await waitUntil("the feed waits again", timeout: 120, every: .milliseconds(5)) {
                f.store.commitWaiters > 0 && clock.pendingDeadlines == [.milliseconds(1000)]
            }
            clock.advance(by: .milliseconds(400))
            try await waitUntil("the feed waits after its heartbeat", timeout: 120, every: .milliseconds(5)) {
                f.store.commitWaiters > 0 && clock.pendingDeadlines == [.milliseconds(2000)]
            }
            try f.put("x", ["n": 2])
            let r = try await answer
            #expect(r.lines.count == 4, "\(r.text.debugDescription)")
            #expect(r.lines.first == "")
            #expect((try? JSON.parse(String(r.lines[1])))?["id"] == "x")
            #expect((try? JSON.parse(String(r.lines[2])))?["last_seq"] == 2)
        }
    }

    @Test func eventSourceHeartbeatsAreEvents() async throws {
        let f = try DatabaseFixture()
        let clock = ManualClock()
        var database = f.database
        database.clock = clock
        try await f.test(database: database) { c async throws in
            async let answer = c.get("/ferry/_changes?feed=eventsource&heartbeat=1000&timeout=1500")
            try await waitUntil("the feed sleeps until its heartbeat", timeout: 120, every: .milliseconds(5)) {
                clock.pendingDeadlines == [.milliseconds(1000)]
            }
            clock.advance(by: .milliseconds(1000))
            try await waitUntil("the feed sleeps until its timeout", timeout: 120, every: .milliseconds(5)) {
                clock.pendingDeadlines == [.milliseconds(1500)]
            }
            clock.advance(by: .milliseconds(500))
            let r = try await answer
            #expect(r.text == "event: heartbeat\ndata: \n\n", "\(r.text.debugDescription)")
        }
    }

    @Test func eventSourceFeedFramesEachChangeAsAnEvent() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try f.put("b", ["n": 1])
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_changes?feed=eventsource&since=0&limit=2")
            #expect(r.headers[.contentType] == "text/event-stream")
            let events = r.text.components(separatedBy: "\n\n").filter { !$0.isEmpty }
            #expect(events.count == 2)
            #expect(events[0].hasPrefix("data: {"))
            #expect(events[0].hasSuffix("\nid: 1"))
            #expect(events[1].hasSuffix("\nid: 2"))
        }
    }

    @Test func aNodeStopEndsAWaitingContinuousFeed() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            async let answer = c.get("/ferry/_changes?feed=continuous&heartbeat=600000")
            try await waitUntil("the feed waits", timeout: 120, every: .milliseconds(5)) { f.store.commitWaiters > 0 }
            f.database.shutdown.fire()
            let r = try await answer
            #expect(r.lines.contains { (try? JSON.parse(String($0)))?["last_seq"] == 0 })
        }
    }

    @Test func aSequenceServedBeforeARestartStillWorksAsSince() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try f.put("b", ["n": 1])
        let served = Locked<JSON?>(nil)
        try await f.test { c async throws in
            let last = try await c.get("/ferry/_changes")["last_seq"]
            served.withLock { $0 = last }
        }
        let since = served.withLock { $0 }
        try f.put("c", ["n": 1])
        let restarted = try f.reopened()
        try await f.test(database: restarted) { c async throws in
            let r = try await c.get("/ferry/_changes?since=\(since!.canonicalString)")
            #expect(r.ids == ["c"])
            #expect(try await c.get("/ferry")["update_seq"] == 3)
        }
    }

    @Test func localDocumentsNeverAppearInChangesOrAllDocs() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try await f.test { c async throws in
            #expect(try await c.put("/ferry/_local/cp", #"{"seq":1}"#).status == 201)
            #expect(try await c.get("/ferry/_changes").ids == ["a"])
            #expect(try await c.get("/ferry/_all_docs").ids == ["a"])
        }
    }
}

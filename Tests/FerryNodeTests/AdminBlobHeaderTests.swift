import FerryCore
import Testing

@testable import FerryNode

/// A blob's bytes from the admin API never render as a page in a dashboard session's browser.
@Suite(.timeLimit(.minutes(2))) struct AdminBlobHeaderTests {
    @Test func anUploadedHTMLBlobIsServedAsASandboxedUnsniffedDownload() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            let page = "<script>fetch('/docs').then(r => r.text()).then(alert)</script>"
            let made = try await c.call(.post, "/blobs", body: page, headers: ["Content-Type": "text/html"])
            #expect(made.status == 201, "\(made.text)")
            let digest = try #require(made["digest"]?.stringValue)
            let served = try await c.call(.get, "/blobs/\(digest)")
            #expect(served.status == 200 && served.text == page)
            #expect(served.headers[.contentSecurityPolicy] == "sandbox")
            #expect(served.headers[.xContentTypeOptions] == "nosniff")
            #expect(served.headers[.contentDisposition]?.hasPrefix("attachment") == true)
            #expect(served.headers[.contentType] == "application/octet-stream")
        }
    }
}

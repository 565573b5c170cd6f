import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `make install` and `make deb` (scripts/install.sh, scripts/make-deb.sh): what they lay
/// out, the unit pointing at the installed binary, the package's metadata and scripts, and
/// the refusal of a binary that needs the Swift toolchain's libraries.
@Suite struct PackagingTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized.path

    static func tempDir() throws -> String {
        let dir = NSTemporaryDirectory() + "ferry-pkg-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    /// An executable that answers --version like ferry and links nothing. Written by a
    /// child shell: a file this process held open for writing could be inherited by a child
    /// another test spawns meanwhile, and running it would then fail with ETXTBSY.
    static func standIn(in dir: String) async throws -> String {
        let path = dir + "/ferry-stand-in"
        let r = try await Shell.bash("printf '#!/bin/sh\\necho 0.3.0\\n' > '\(path)' && chmod 755 '\(path)'")
        guard r.status == 0 else { throw HarnessError("cannot write \(path): \(r.stderr)") }
        return path
    }

    @Test func installPutsTheBinaryAndAUnitThatRunsItUnderDestdir() async throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let binary = try await Self.standIn(in: dir)
        let r = try await Shell.run([binary, dir + "/stage", "/opt/ferry"], executable: Self.root + "/scripts/install.sh")
        #expect(r.status == 0, "\(r.stderr)")
        #expect(FileManager.default.isExecutableFile(atPath: dir + "/stage/opt/ferry/bin/ferry"))
        let unit = try String(contentsOfFile: dir + "/stage/etc/systemd/system/ferry.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=/opt/ferry/bin/ferry serve --data /var/lib/ferry"))
        #expect(unit.contains("\nUser=ferry\n") && unit.contains("\nLimitNOFILE=65536\n"))
    }

    @Test func theInstalledUnitPassesSystemdAnalyzeVerify() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-analyze"), "systemd-analyze is missing: run make deps")
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let binary = try await Self.standIn(in: dir)
        // Installed for real under a private prefix, so the unit's ExecStart exists.
        let installed = try await Shell.run([binary, "", dir + "/prefix", dir + "/units"], executable: Self.root + "/scripts/install.sh")
        #expect(installed.status == 0, "\(installed.stderr)")
        let verify = try await Shell.run(["verify", dir + "/units/ferry.service"], executable: "/usr/bin/systemd-analyze")
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
    }

    @Test func theDebianPackageHoldsTheBinaryUnitConfigAndCreatesTheUser() async throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let binary = try await Self.standIn(in: dir)
        let made = try await Shell.run([binary, dir + "/out"], executable: Self.root + "/scripts/make-deb.sh")
        #expect(made.status == 0, "\(made.stderr) \(made.stdout)")
        let deb = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(deb.hasSuffix("ferry_0.3.0_\(try await Shell.bash("dpkg --print-architecture").stdout.trimmingCharacters(in: .whitespacesAndNewlines)).deb"))
        let fields = try await Shell.run(["-f", deb, "Package", "Version", "Depends", "Recommends"], executable: "/usr/bin/dpkg-deb")
        #expect(fields.stdout.contains("Package: ferry") && fields.stdout.contains("Version: 0.3.0"), "\(fields.stdout)")
        #expect(fields.stdout.contains("libavahi-compat-libdnssd1") && fields.stdout.contains("Recommends: avahi-daemon"))
        let listing = try await Shell.run(["-c", deb], executable: "/usr/bin/dpkg-deb")
        #expect(listing.status == 0, "\(listing.stderr)")
        let contents = listing.stdout
        for path in ["./usr/bin/ferry", "./lib/systemd/system/ferry.service", "./etc/ferry/ferry.json"] {
            #expect(contents.contains(path), "\(path) is missing from the package")
        }
        let extracted = dir + "/x"
        #expect(try await Shell.run(["-R", deb, extracted], executable: "/usr/bin/dpkg-deb").status == 0)
        let unit = try String(contentsOfFile: extracted + "/lib/systemd/system/ferry.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=/usr/bin/ferry serve --data /var/lib/ferry --config /etc/ferry/ferry.json"))
        #expect(try String(contentsOfFile: extracted + "/DEBIAN/conffiles", encoding: .utf8) == "/etc/ferry/ferry.json\n")
        let postinst = extracted + "/DEBIAN/postinst"
        #expect(try await Shell.run(["-n", postinst], executable: "/bin/sh").status == 0)
        let script = try String(contentsOfFile: postinst, encoding: .utf8)
        #expect(script.contains("adduser --system --group --home /var/lib/ferry"))
        // Without systemd's StateDirectory= nothing else makes the data directory the user may write.
        #expect(script.contains("install -d -o ferry -g ferry -m 0700 /var/lib/ferry"))
    }

    @Test func aBinaryThatNeedsTheSwiftToolchainIsNotPackaged() async throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // The debug build links the toolchain's libswiftCore.so, which no Debian package provides.
        let r = try await Shell.run([Ferry.binary, dir + "/out"], executable: Self.root + "/scripts/make-deb.sh")
        #expect(r.status == 1)
        #expect(r.stderr.contains("libswiftCore.so") && r.stderr.contains("--static-swift-stdlib"), "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/out"))
    }
}

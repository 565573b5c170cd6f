import FerryCore
import FerrySync
import Foundation

#if FUZZING
// Built by `make fuzz` with `-sanitize=fuzzer,address -DFUZZING`: libFuzzer drives the target
// named by FERRY_FUZZ_TARGET. SwiftPM links an executable's entry point as `main`, so libFuzzer's
// own main is replaced by this one, which hands over to libFuzzer's driver.
let fuzzTarget: FuzzTarget = {
    guard let name = ProcessInfo.processInfo.environment["FERRY_FUZZ_TARGET"], let target = FuzzTarget(rawValue: name) else {
        let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
        FileHandle.standardError.write(Data("ferry-fuzz: set FERRY_FUZZ_TARGET to one of: \(names)\n".utf8))
        exit(2)
    }
    return target
}()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzTarget.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}

@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

@_cdecl("ferry_fuzz_main")
public func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    _ = fuzzTarget
    var count = argc
    var arguments: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&count, &arguments, fuzzOneInput)
}
#else
/// Without libFuzzer: replays inputs (the committed corpora, or a crash file) through a
/// target, and writes the seed corpora from Ferry's own encoders.
///
///     ferry-fuzz replay TARGET PATH...   every file (directories: every file in them)
///     ferry-fuzz seeds DIR               writes DIR/TARGET/* for every target
///     ferry-fuzz targets                 lists the targets
@main struct FuzzReplay {
    static func main() {
        var arguments = Array(CommandLine.arguments.dropFirst())
        let command = arguments.isEmpty ? "" : arguments.removeFirst()
        switch command {
        case "replay":
            guard let name = arguments.first, let target = FuzzTarget(rawValue: name), arguments.count >= 2 else {
                fail("usage: ferry-fuzz replay TARGET PATH...  (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))")
            }
            var count = 0
            for path in arguments.dropFirst() {
                for file in files(at: path) {
                    guard let data = FileManager.default.contents(atPath: file) else { fail("cannot read \(file)") }
                    target.run(Array(data))
                    count += 1
                }
            }
            print("\(target.rawValue): \(count) inputs, no crash")
        case "seeds":
            guard arguments.count == 1 else { fail("usage: ferry-fuzz seeds DIR") }
            for (target, seeds) in FuzzSeeds.all {
                let dir = "\(arguments[0])/\(target.rawValue)"
                try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
                for (name, bytes) in seeds where !FileManager.default.createFile(atPath: "\(dir)/\(name)", contents: Data(bytes)) {
                    fail("cannot write \(dir)/\(name)")
                }
            }
        case "targets":
            for t in FuzzTarget.allCases { print(t.rawValue) }
        default:
            fail("usage: ferry-fuzz replay TARGET PATH... | seeds DIR | targets")
        }
    }

    static func files(at path: String) -> [String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { fail("no such file: \(path)") }
        guard isDirectory.boolValue else { return [path] }
        let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
        return names.sorted().map { "\(path)/\($0)" }
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("ferry-fuzz: \(message)\n".utf8))
        exit(2)
    }
}
#endif

import FerryCore
import Foundation

/// One measured figure as the JSON report holds it: the median value, its same-run
/// baseline, their ratio, the target and whether it holds, and every run.
struct Figure {
    let id: String
    let name: String
    let value: Double
    let unit: String
    let baseline: Double?
    let ratio: Double
    /// Human-readable target, e.g. ">= 0.5".
    let target: String
    let holds: Bool
    /// Per run: value, baseline and ratio.
    let runs: [(value: Double, baseline: Double?, ratio: Double)]

    var json: JSON {
        [
            "id": .string(id), "name": .string(name), "value": .number(value), "unit": .string(unit),
            "baseline": baseline.map(JSON.number) ?? .null, "ratio": .number((ratio * 1000).rounded() / 1000),
            "target": .string(target), "holds": .bool(holds),
            "runs": .array(runs.map { r in
                ["value": .number(r.value), "baseline": r.baseline.map(JSON.number) ?? .null, "ratio": .number((r.ratio * 1000).rounded() / 1000)]
            }),
        ]
    }
}

/// The benchmark report (`Benchmarks/results/latest.json`): each subcommand given
/// `--report FILE` replaces its figures in the file and keeps the others.
enum BenchReport {
    static func record(_ figures: [Figure], in path: String) throws {
        var existing: [JSON] = []
        if let data = FileManager.default.contents(atPath: path), let old = try? JSON.parse(Array(data)),
            case .array(let list)? = old["figures"]
        {
            existing = list.filter { f in !figures.contains { $0.id == f["id"]?.stringValue } }
        }
        let all = (existing + figures.map(\.json)).sorted { ($0["id"]?.stringValue ?? "") < ($1["id"]?.stringValue ?? "") }
        let report: JSON = [
            "machine": .string(machine), "date": .string(ISO8601DateFormatter().string(from: Date())), "figures": .array(all),
        ]
        try FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data(report.prettyString.utf8).write(to: URL(fileURLWithPath: path))
    }

    /// Kernel, CPU model and core count, as far as Linux tells.
    static var machine: String {
        var u = utsname()
        uname(&u)
        let release = withUnsafeBytes(of: &u.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let cpu = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
            .split(separator: "\n").first { $0.hasPrefix("model name") }?
            .split(separator: ":", maxSplits: 1).last?.trimmingCharacters(in: .whitespaces) ?? "unknown CPU"
        return "Linux \(release), \(cpu), \(ProcessInfo.processInfo.activeProcessorCount) cores"
    }
}

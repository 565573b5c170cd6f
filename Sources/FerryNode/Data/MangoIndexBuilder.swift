import FerryStore
import Logging
import ServiceLifecycle

/// Fills new Mango indexes over the documents stored before them, and clears dropped ones,
/// one short transaction at a time, whenever the store has such work.
///
/// It wakes on this process's commits (a design document written here or replicated in) and,
/// for commits by other processes on the same database, every `pollInterval` of its clock.
public struct MangoIndexBuilder<C: Clock>: Service where C.Duration == Duration {
    let store: DocumentStore
    let clock: C
    let pollInterval: Duration
    let progressInterval: Duration
    let batchSize: Int
    let logger: Logger

    /// - Parameters:
    ///   - batchSize: documents (or dropped entries) per transaction; writers wait at most one batch.
    ///   - progressInterval: the least time between two progress logs of the builder.
    public init(
        store: DocumentStore, clock: C, pollInterval: Duration = .seconds(5), progressInterval: Duration = .seconds(5),
        batchSize: Int = 1000, logger: Logger = Logger(label: "ferry.index")
    ) {
        self.store = store
        self.clock = clock
        self.pollInterval = pollInterval
        self.progressInterval = progressInterval
        self.batchSize = batchSize
        self.logger = logger
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown { await buildWhileRunning() }
    }

    private func buildWhileRunning() async {
        var progress = ProgressLog(logger: logger, interval: progressInterval, clock: clock)
        while !Task.isCancelled {
            // Read before looking for work: a commit after this point wakes the wait below.
            let seen = (try? store.lastSequence) ?? 0
            do {
                if try store.hasPendingMangoIndexWork() {
                    progress.starting(try store.mangoIndexes())
                    let step = try await store.buildMangoIndexesSuspending(maxDocuments: batchSize)
                    progress.record(step, store: store)
                    if step.work > 0 {
                        await Task.yield()
                        continue
                    }
                }
            } catch {
                logger.error("index build step failed", metadata: ["error": "\(error)"])
            }
            await waitForWork(past: seen)
        }
    }

    /// Returns on the next commit of this process past `sequence`, after `pollInterval`, or on cancellation.
    private func waitForWork(past sequence: UInt64) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await store.waitForCommit(past: sequence) }
            group.addTask { try? await clock.sleep(for: pollInterval) }
            await group.next()
            group.cancelAll()
        }
    }

    /// Logs when an index starts building, its progress at most every `interval`, and when
    /// it is ready (or was dropped before it was).
    struct ProgressLog {
        let logger: Logger
        let interval: Duration
        let clock: C
        var building: [Int64: StoredMangoIndex] = [:]
        var lastProgress: C.Instant?

        /// Logs the start of each index that is building and was not before.
        mutating func starting(_ indexes: [StoredMangoIndex]) {
            for index in indexes where building[index.id] == nil {
                guard case .building = index.state else { continue }
                logger.info("building index", metadata: metadata(index))
                building[index.id] = index
            }
        }

        mutating func record(_ step: MangoIndexBuildStep, store: DocumentStore) {
            var now: [Int64: StoredMangoIndex] = [:]
            for index in step.building { now[index.id] = index }
            for (id, index) in now where building[id] == nil {
                logger.info("building index", metadata: metadata(index))
            }
            let finished = building.keys.filter { now[$0] == nil }
            if !finished.isEmpty {
                let current = (try? store.mangoIndexes()) ?? []
                for id in finished.sorted() {
                    let index = building[id]!
                    if current.contains(where: { $0.id == id && $0.state == .ready }) {
                        var ready = index
                        ready.state = .ready
                        logger.info("index ready", metadata: metadata(ready))
                    } else {
                        logger.info("index dropped before it was built", metadata: metadata(index))
                    }
                }
            }
            let instant = clock.now
            if !now.isEmpty, lastProgress.map({ $0.duration(to: instant) >= interval }) ?? true {
                if lastProgress != nil {
                    for index in now.values.sorted(by: { $0.id < $1.id }) {
                        logger.info("index build progress", metadata: metadata(index))
                    }
                }
                lastProgress = instant
            }
            if now.isEmpty { lastProgress = nil }
            building = now
        }

        private func metadata(_ index: StoredMangoIndex) -> Logger.Metadata {
            var out: Logger.Metadata = [
                "ddoc": "\(index.index.designDocument)", "name": "\(index.index.name)", "index": "\(index.id)",
            ]
            switch index.state {
            case .building(let done, let total):
                out["done"] = "\(done)"
                out["total"] = "\(total)"
            case .ready:
                break
            }
            return out
        }
    }
}

extension FerryNode {
    /// The node's index builder, on the node's clock.
    func makeIndexBuilder() -> any Service { Self.indexBuilder(store: store, clock: clock, logger: logger) }

    private static func indexBuilder(store: DocumentStore, clock: some Clock<Duration>, logger: Logger) -> any Service {
        var indexLogger = logger
        indexLogger[metadataKey: "component"] = "index"
        return MangoIndexBuilder(store: store, clock: clock, logger: indexLogger)
    }
}

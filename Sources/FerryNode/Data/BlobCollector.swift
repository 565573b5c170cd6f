import CoreMetrics
import FerryCore
import FerryStore
import Logging
import ServiceLifecycle

/// Deletes, every `interval` of its clock, the blobs no stored revision refers to that
/// have not been stored or used for `grace` (DocumentStore.collectBlobs), counting what it
/// frees; a failed pass is logged and the next one runs on schedule.
public struct BlobCollector<C: Clock>: Service where C.Duration == Duration {
    let store: DocumentStore
    let clock: C
    let interval: Duration
    let grace: Duration
    /// Partial blobs not written for this long are removed by each pass.
    let partialMaxAge: Duration
    let collected: Counter?
    let collectedBytes: Counter?
    let logger: Logger

    public init(
        store: DocumentStore, clock: C, interval: Duration, grace: Duration, partialMaxAge: Duration = .seconds(86400),
        collected: Counter? = nil,
        collectedBytes: Counter? = nil, logger: Logger = Logger(label: "ferry.blobs")
    ) {
        self.store = store
        self.clock = clock
        self.interval = interval
        self.grace = grace
        self.partialMaxAge = partialMaxAge
        self.collected = collected
        self.collectedBytes = collectedBytes
        self.logger = logger
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do { try await clock.sleep(for: interval) } catch { return }
                await collectOnce()
            }
        }
    }

    /// One collection pass, off the cooperative pool through `BlockingIO` (it scans every
    /// document and deletes files, and may take a while).
    func collectOnce() async {
        let store = self.store
        let minimumAge = Double(grace.components.seconds) + Double(grace.components.attoseconds) / 1e18
        let partialAge = Double(partialMaxAge.components.seconds)
        let result: Result<(count: Int, bytes: Int64), StoreError>
        do {
            result = try await BlockingIO.run { () -> Result<(count: Int, bytes: Int64), StoreError> in
                let partials = store.blobs.tidyPartials(unwrittenFor: partialAge)
                do throws(StoreError) {
                    let removed = try store.collectBlobs(minimumAge: minimumAge)
                    return .success((removed.count + partials.count, removed.bytes + partials.bytes))
                } catch { return .failure(error) }
            }
        } catch {
            result = .failure(.io("\(error)"))
        }
        switch result {
        case .success(let removed):
            collected?.increment(by: removed.count)
            collectedBytes?.increment(by: Int(clamping: removed.bytes))
            logger.debug("blob collection done", metadata: ["removed": "\(removed.count)", "bytes": "\(removed.bytes)"])
        case .failure(let error):
            logger.error("blob collection failed", metadata: ["error": "\(error)", "transient": "\(error.isTransient)"])
        }
    }
}

extension FerryNode {
    /// The node's blob collector, or nil when the configuration turns collection off.
    func makeBlobCollector() -> (any Service)? {
        let settings = configuration.blobCollection
        guard settings.intervalSeconds > 0 else { return nil }
        var blobLogger = logger
        blobLogger[metadataKey: "component"] = "blobs"
        let collector: any Service = Self.blobCollector(
            store: store, clock: clock, settings: settings, metrics: metrics, logger: blobLogger)
        return collector
    }

    private static func blobCollector(
        store: DocumentStore, clock: some Clock<Duration>, settings: NodeConfiguration.BlobCollection, metrics: NodeMetrics,
        logger: Logger
    ) -> any Service {
        BlobCollector(
            store: store, clock: clock, interval: .seconds(settings.intervalSeconds), grace: .seconds(settings.graceSeconds),
            partialMaxAge: .seconds(settings.partialMaxAgeSeconds),
            collected: Counter(label: "ferry_blobs_collected_total", factory: metrics.factory),
            collectedBytes: Counter(label: "ferry_blobs_collected_bytes_total", factory: metrics.factory), logger: logger)
    }
}

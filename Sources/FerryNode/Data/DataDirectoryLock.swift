import Foundation

/// An exclusive lock on a data directory (flock on DATA/serve.lock), held while a node runs.
final class DataDirectoryLock: Sendable {
    let fd: Int32

    init(directory: String) throws(NodeError) {
        let path = "\(directory)/serve.lock"
        fd = open(path, O_RDWR | O_CREAT, 0o644)
        guard fd >= 0 else { throw .startFailed("cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            var buf = [UInt8](repeating: 0, count: 32)
            let n = pread(fd, &buf, 32, 0)
            let holder = n > 0 ? String(decoding: buf[..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : "?"
            close(fd)
            throw .locked("another ferry serve (pid \(holder)) is already running on \(directory)")
        }
        ftruncate(fd, 0)
        let pid = Array("\(getpid())\n".utf8)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    deinit { close(fd) }
}

"""One `ferry serve` for the attack tests: its own data directory, ephemeral ports on
127.0.0.1, no DNS-SD, started from the binary in $FERRY_BINARY (default .build/debug/ferry),
ready once node.json names its pid, stopped with SIGTERM (SIGKILL after a minute)."""

import json
import os
import signal
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FERRY = os.environ.get("FERRY_BINARY") or os.path.join(ROOT, ".build", "debug", "ferry")


class Node:
    """One `ferry serve` with its own data directory, stopped with SIGTERM."""

    def __init__(self, root, name):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, mode=0o700)
        self.log = os.path.join(root, name + ".log")
        self.proc = None
        self.info = None

    def ferry(self, *args, env=None, stdin=None, data=True):
        """Runs the CLI on this node's data directory; returns the completed process."""
        return subprocess.run(
            [FERRY, *args, *(["--data", self.dir] if data else [])], capture_output=True, text=True, env=env, input=stdin,
            timeout=120)

    def start(self, *extra, env=None):
        node_json = os.path.join(self.dir, "node.json")
        args = [FERRY, "serve", "--data", self.dir, "--port", "0", "--admin-port", "0", "--couch-port", "0",
                "--interface", "127.0.0.1", "--no-discovery", *extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"ferry serve exited {self.proc.returncode}: {open(self.log).read()[-2000:]}")
            try:
                with open(node_json) as f:
                    info = json.load(f)
                if info.get("pid") == self.proc.pid:
                    self.info = info
                    return info
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError("ferry serve did not become ready: " + open(self.log).read()[-2000:])

    @property
    def key(self):
        with open(os.path.join(self.dir, "admin.key")) as f:
            return f.read().strip()

    @property
    def admin_port(self):
        return int(self.info["adminPort"])

    @property
    def couch_port(self):
        return int(self.info["couchURL"].rstrip("/").rsplit(":", 1)[1])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

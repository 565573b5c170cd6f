#!/usr/bin/env python3
"""Measures what a flood of idle TCP connections does to a node, on loopback only.

Starts `FERRY serve` (under `prlimit --nofile=N:N` when --nofile is given) on 127.0.0.1,
opens CONNECTIONS idle connections to its replication port and as many to its CouchDB
port, from 127.0.0.2 upwards (100 per source address), then prints: the admin API's answer
time (GET / with the admin key) before and during the flood, how many flood connections
the node has closed, its RSS and CPU while the flood is held, and then while the flood
re-opens every connection the node closes (a sustained attack).

    python3 scripts/flood-measure.py .build/debug/ferry --connections 1100 --nofile 1024
    python3 scripts/flood-measure.py .build/debug/ferry --connections 10000 --nofile 65536
"""
import argparse
import errno
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

PER_SOURCE = 100


def admin_times(base, key, n=20, timeout=5.0):
    """Answer times of n sequential GET / (seconds; None for a failure)."""
    times = []
    for _ in range(n):
        req = urllib.request.Request(base + "/", headers={"Authorization": "Bearer " + key})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
                times.append(time.monotonic() - start if r.status == 200 else None)
        except Exception:
            times.append(None)
    return times


def summary(times):
    ok = [t for t in times if t is not None]
    failed = len(times) - len(ok)
    if not ok:
        return f"all {len(times)} failed"
    return f"median {statistics.median(ok) * 1000:.1f} ms, max {max(ok) * 1000:.1f} ms, {failed}/{len(times)} failed"


def proc_stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    return ticks / os.sysconf("SC_CLK_TCK"), rss // 1024


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def connect(port, index):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((f"127.0.{2 + index // PER_SOURCE // 250}.{2 + (index // PER_SOURCE) % 250}", 0))
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        return None
    return s


def closed(s):
    try:
        data = s.recv(1, socket.MSG_PEEK)
        return data == b""
    except BlockingIOError:
        return False
    except OSError as e:
        return e.errno != errno.EAGAIN


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ferry")
    p.add_argument("--connections", type=int, default=1100, help="per port")
    p.add_argument("--nofile", type=int, help="the node's RLIMIT_NOFILE (soft and hard)")
    p.add_argument("--hold", type=float, default=5.0, help="seconds to hold the flood before measuring")
    p.add_argument("--churn", type=float, default=10.0, help="seconds of re-opening closed connections")
    p.add_argument("--pace", type=float, default=0.05, help="seconds of pause after each 100 connections")
    a = p.parse_args()
    need = 2 * a.connections + 128
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            except (ValueError, OSError):
                sys.exit(f"this needs {need} descriptors and the hard limit is {hard}: lower --connections")
        else:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    root = tempfile.mkdtemp(prefix="ferry-flood-")
    data = os.path.join(root, "data")
    cmd = [a.ferry, "--data", data, "serve", "--port", "0", "--admin-port", "0", "--couch-port", "0",
           "--name", "flood", "--interface", "127.0.0.1", "--no-discovery"]
    if a.nofile:
        cmd = ["prlimit", f"--nofile={a.nofile}:{a.nofile}"] + cmd
    log = open(os.path.join(root, "node.log"), "w")
    node = subprocess.Popen(cmd, stdout=log, stderr=log)
    info = None
    for _ in range(600):
        try:
            with open(os.path.join(data, "node.json")) as f:
                info = json.load(f)
            if info.get("pid") == node.pid:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    key = open(info["adminKeyFile"]).read().strip()
    base, repl, couch = info["adminURL"], info["port"], info["couchPort"]
    for _ in range(100):
        if admin_times(base, key, 1)[0] is not None:
            break
        time.sleep(0.1)
    print(f"binary {a.ferry}; node limit {a.nofile or 'inherited'}; {a.connections} connections to each of two ports")
    print(f"admin API, no flood:        {summary(admin_times(base, key))}")

    cpu0, _ = proc_stat(node.pid)
    t0 = time.monotonic()
    flood = []
    for port in (repl, couch):
        for i in range(a.connections):
            s = connect(port, i)
            if s:
                flood.append((port, i, s))
            # Paced so the node's accept queue never overflows: past it the kernel answers with
            # SYN cookies and the node never sees the connection at all.
            if i % 100 == 99:
                time.sleep(a.pace)
    opened = time.monotonic() - t0
    time.sleep(a.hold)
    during = admin_times(base, key)
    cpu1, rss1 = proc_stat(node.pid)
    t1 = time.monotonic()
    shut = sum(1 for _, _, s in flood if closed(s))
    print(f"flood opened in {opened:.1f} s; after {a.hold:.0f} s the node has closed {shut} of {len(flood)}, holds {open_fds(node.pid)} descriptors")
    print(f"admin API, flood held:      {summary(during)}")
    print(f"node while held:            CPU {100 * (cpu1 - cpu0) / (t1 - t0):.0f} %, RSS {rss1} MiB")

    # A sustained attack: every connection the node closes is opened again at once.
    end = time.monotonic() + a.churn
    reopened = 0
    peak = rss1
    while time.monotonic() < end:
        for n, (port, i, s) in enumerate(flood):
            if closed(s):
                s.close()
                r = connect(port, i)
                if r:
                    flood[n] = (port, i, r)
                    reopened += 1
        _, rss = proc_stat(node.pid)
        peak = max(peak, rss)
    churn_times = admin_times(base, key)
    cpu2, rss2 = proc_stat(node.pid)
    t2 = time.monotonic()
    print(f"admin API, flood re-opened: {summary(churn_times)} ({reopened} re-opened in {a.churn:.0f} s)")
    print(f"node while re-opened:       CPU {100 * (cpu2 - cpu1) / (t2 - t1):.0f} %, RSS peak {peak} MiB")
    alive = node.poll() is None
    for _, _, s in flood:
        s.close()
    node.terminate()
    try:
        node.wait(30)
    except subprocess.TimeoutExpired:
        node.kill()
    print(f"node alive at the end: {alive}; exit {node.returncode}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

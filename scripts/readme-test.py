#!/usr/bin/env python3
"""Runs the shell commands of README.md and docs/*.md as written, in order.

    scripts/readme-test.py [-v] [FILE.md ...]     (FERRY_BIN: the ferry binary to use)

The documents run in order in a fresh directory that stands in for the repository root
(.build/debug/ferry is FERRY_BIN), in one bash, so variables ($F) and the tour's node carry
over from block to block and into docs/*.md, as in one reader's terminal. Blocks with no language or sh/bash/shell run line by line;
python blocks run with python3; others (json, swift, text) are not commands. A block that
is only `make run` ("start a peer in one terminal") starts what the Makefile's run target
runs, in the background, and the next block waits until the node's node.json names an
admin URL that answers. A comment naming an exit status ("exit 4") makes that status
expected; "within N seconds" lets a line retry that long (with room for a loaded machine).
A block is skipped only after a marker:  <!-- readme-test: skip: REASON -->

As root each document gets a private /tmp (the docs write /tmp/node-b and the like) and
DNS-SD a private avahi-daemon (scripts/avahi-loopback.sh) whose mDNS stays on a
namespace's lo; otherwise the /tmp paths the commands name must not exist yet, and the
machine's avahi-daemon is used. Every process the commands start is in one process group,
stopped (SIGTERM, then SIGKILL) at the end, whether they passed or not.
"""
import argparse
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"", "sh", "bash", "shell"}
PYTHON_LANGS = {"python", "python3", "py"}
PORTS = [(4985, "0.0.0.0", "peer port"), (4986, "127.0.0.1", "admin API port"),
         (4987, "127.0.0.1", "CouchDB API port")]
COMMAND_TIMEOUT = 180
READY_TIMEOUT = 60
# "within a second" is a latency claim; on a loaded machine it gets this much room.
WITHIN_LIMIT = 15
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
EXIT_NOTE = re.compile(r"\bexit(?: status)? (\d+)\b")
WITHIN_NOTE = re.compile(r"\bwithin (a|an|one|two|\d+(?:\.\d+)?) (seconds?|s)\b")
WORDS = {"a": 1, "an": 1, "one": 1, "two": 2}


class Failure(Exception):
    pass


class Block:
    def __init__(self, doc, line, lang, lines, section, skip):
        self.doc, self.line, self.lang, self.lines = doc, line, lang, lines
        self.section, self.skip = section, skip

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    @property
    def kind(self):
        if self.lang in SHELL_LANGS:
            return "shell"
        if self.lang in PYTHON_LANGS:
            return "python"
        return None

    def text(self):
        return "\n".join(t for _, t in self.lines)


def parse(path, name):
    """The fenced blocks of a Markdown file, with their section and skip marker."""
    blocks, section, pending = [], "", None
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            indent, fence, lang = m.groups()
            body, j = [], i + 1
            while j < len(lines) and not re.match(rf"^\s*{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
                body.append((j + 1, lines[j][len(indent):] if lines[j].startswith(indent) else lines[j]))
                j += 1
            blocks.append(Block(name, i + 1, lang.lower(), body, section, pending[1] if pending else None))
            pending, i = None, j + 1
            continue
        marker = MARKER.match(line)
        if marker:
            kind, _, reason = marker.group(1).partition(":")
            if kind.strip() != "skip" or not reason.strip():
                raise Failure(f"{name}:{i + 1}: unknown marker {line.strip()!r} (expected <!-- readme-test: skip: REASON -->)")
            pending = (i + 1, reason.strip())
        elif line.strip():
            if pending:
                raise Failure(f"{name}:{pending[0]}: a readme-test marker must come right before a code block")
            if line.startswith("#"):
                section = line.lstrip("#").strip()
        i += 1
    if pending:
        raise Failure(f"{name}:{pending[0]}: a readme-test marker must come right before a code block")
    return blocks


def comment_of(line):
    """The shell comment of one line (after an unquoted # that starts a word), or ''."""
    quote, prev, k = None, " ", 0
    while k < len(line):
        c = line[k]
        if quote == "'":
            quote = None if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                k += 1
            elif c == '"':
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "\\":
            k += 1
        elif c == "#" and (prev.isspace() or prev in ";&|()<>"):
            return line[k + 1:]
        prev = line[k] if k < len(line) else prev
        k += 1
    return ""


def parses(text):
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


def commands(block):
    """The block's commands: (line, text, expected exit status, seconds it may retry)."""
    result, chunk, first = [], [], None
    for number, text in block.lines:
        if not chunk and (not text.strip() or text.lstrip().startswith("#")):
            continue
        first = first or number
        chunk.append(text)
        joined = "\n".join(chunk)
        if text.rstrip().endswith("\\") and not comment_of(text) or not parses(joined):
            continue
        notes = " ".join(comment_of(t) for t in chunk)
        expected = EXIT_NOTE.search(notes)
        within = WITHIN_NOTE.search(notes)
        seconds = None
        if within:
            seconds = WORDS.get(within.group(1)) or float(within.group(1))
        result.append((first, joined, int(expected.group(1)) if expected else 0, seconds))
        chunk, first = [], None
    if chunk:
        raise Failure(f"{block.where}: line {first} is not a complete shell command")
    return result


def starts_node(block):
    return block.kind == "shell" and not block.skip and re.search(r"^\s*make run\b|\bserve\b", block.text(), re.M)


def makefile_run():
    """What `make run` runs after building, with the Makefile's defaults filled in."""
    text = (REPO / "Makefile").read_text()
    defaults = dict(re.findall(r"^(\w+)\s*\?=\s*(.*?)\s*$", text, re.M))
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", text, re.M)
    if not recipe:
        raise Failure("Makefile: no run target")
    line = recipe.group(1).strip().split("\n")[-1].strip()
    return re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), ""), line)


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def group_alive(pgid):
    reap()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in "ZX" and int(fields[2]) == pgid:
            return True
    return False


def stop_group(pgid):
    """SIGTERM the group (ferry stops gracefully), then SIGKILL what is left. True if clean."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return sig == signal.SIGTERM
            time.sleep(0.05)
    return not group_alive(pgid)


def check_ports():
    taken = []
    for port, host, what in PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                taken.append(f"port {port} ({what})")
    if taken:
        raise Failure(f"{', '.join(taken)} in use: README's commands use the default ports "
                      f"4985, 4986 and 4987; stop what listens there (ss -ltnp) and run again")


def answers(url):
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


class Avahi:
    """avahi-daemon for DNS-SD: a private one as root, else the machine's own."""

    def __init__(self, base):
        self.state, self.env = None, {}
        if os.geteuid() == 0:
            self.state = str(Path(base) / "avahi")
            out = subprocess.run([str(REPO / "scripts/avahi-loopback.sh"), "start", str(os.getpid())],
                                 env={**os.environ, "FERRY_AVAHI_STATE": self.state},
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            found = re.search(r"^DBUS_SYSTEM_BUS_ADDRESS=(\S+)", out.stdout, re.M)
            if out.returncode != 0 or not found:
                raise Failure(f"scripts/avahi-loopback.sh start failed: {out.stderr.strip()}")
            self.env = {"DBUS_SYSTEM_BUS_ADDRESS": found.group(1)}
        else:
            probe = subprocess.run(["dbus-send", "--system", "--print-reply", "--reply-timeout=2000",
                                    "--dest=org.freedesktop.Avahi", "/",
                                    "org.freedesktop.Avahi.Server.GetState"], capture_output=True, text=True)
            if "int32 2" not in probe.stdout:
                raise Failure("the nodes the docs start find each other over DNS-SD: run as root (a private "
                              "avahi-daemon is started) or start the machine's avahi-daemon")

    def stop(self):
        if self.state:
            subprocess.run([str(REPO / "scripts/avahi-loopback.sh"), "stop"],
                           env={**os.environ, "FERRY_AVAHI_STATE": self.state},
                           capture_output=True, stdin=subprocess.DEVNULL)


class Shell:
    """One bash for a document, fed one command at a time, in its own process group."""

    def __init__(self, work, env, private_tmp):
        self.work, self.rt = work, work / ".rt"
        self.count = 0
        if private_tmp:
            # The binary and the checkout (its .venv-couch is the python3 on PATH) may live
            # under /tmp, which the private tmpfs hides: each is bound back where it was.
            setup = ("set -e; kept=()\n"
                     'keep() { case "$1" in /tmp/*) ;; *) return 0;; esac; local n=${#kept[@]}; '
                     'if [ -d "$1" ]; then mkdir .rt/kept-$n; else touch .rt/kept-$n; fi; '
                     'mount --bind "$1" .rt/kept-$n; kept+=("$1"); }\n'
                     'keep "$(readlink -f .build/debug/ferry)"; keep ' + shlex.quote(str(REPO)) + "\n"
                     "mount -t tmpfs -o mode=1777 tmpfs /tmp\n"
                     'for i in "${!kept[@]}"; do p=${kept[$i]}; '
                     'if [ -d .rt/kept-$i ]; then mkdir -p "$p"; else mkdir -p "$(dirname "$p")"; touch "$p"; fi; '
                     'mount --bind .rt/kept-$i "$p"; done\n'
                     "set +e; exec bash --noprofile --norc -s")
            argv = ["unshare", "--mount", "--propagation", "private", "--", "bash", "--noprofile",
                    "--norc", "-c", setup]
        else:
            argv = ["bash", "--noprofile", "--norc", "-s"]
        self.log = open(self.rt / "bash.log", "wb")
        self.proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pgid = self.proc.pid
        # Stricter than a terminal: a failing curl before `| grep` fails its line.
        self.run("set -o pipefail")

    def run(self, text, timeout=None):
        """Runs one command in the shell; returns (exit status, output)."""
        if self.proc.poll() is not None:
            raise Failure("not run: the shell has stopped")
        self.count += 1
        out, rc = self.rt / f"out.{self.count}", self.rt / f"rc.{self.count}"
        script = (f"{{\n{text}\n}} </dev/null >{shlex.quote(str(out))} 2>&1\n"
                  f"echo $? >{shlex.quote(str(rc))}.part && mv {shlex.quote(str(rc))}.part {shlex.quote(str(rc))}\n")
        try:
            self.proc.stdin.write(script.encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise Failure("the shell has exited: " + self.bash_log())
        timeout = timeout or COMMAND_TIMEOUT
        deadline = time.monotonic() + timeout
        while not rc.exists():
            if self.proc.poll() is not None:
                raise Failure(f"the shell exited ({self.proc.returncode}): " + self.bash_log())
            if time.monotonic() > deadline:
                # The shell is stuck in it: stop the document's processes, fail what is left.
                stop_group(self.pgid)
                raise Failure(f"did not finish within {timeout} s; output so far:\n" + indent(read(out)))
            time.sleep(0.02)
        return int(rc.read_text().strip() or 1), read(out)

    def bash_log(self):
        self.log.flush()
        return read(self.rt / "bash.log")

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        clean = stop_group(self.pgid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()
        return clean


def read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def indent(text, prefix="    | "):
    return "\n".join(prefix + line for line in text.rstrip("\n").split("\n")) if text.strip() else prefix + "(no output)"


class Runner:
    def __init__(self, ferry_bin, verbose, keep=False):
        self.ferry_bin, self.verbose, self.keep = ferry_bin, verbose, keep
        self.private_tmp = os.geteuid() == 0 and subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode == 0
        self.ran, self.skipped, self.failed, self.other = [], [], [], 0
        self.base = Path(tempfile.mkdtemp(prefix="ferry-readme-", dir="/var/tmp" if self.private_tmp else None))
        self.avahi = None

    def say(self, text=""):
        print(text, flush=True)

    def run_all(self, documents):
        """Every document in one directory and one bash, in order, as one reader would: the
        docs may use the tour's node and $F."""
        blocks = [b for _, bs in documents for b in bs]
        runnable = [b for b in blocks if b.kind and not b.skip]
        for b in blocks:
            if not b.kind:
                self.other += 1
            elif b.skip:
                self.skipped.append((b, b.skip))
        if not runnable:
            return
        work = self.base / "repo"
        (work / ".build/debug").mkdir(parents=True)
        (work / ".rt").mkdir()
        os.symlink(os.path.realpath(self.ferry_bin), work / ".build/debug/ferry")
        tmp_paths = [] if self.private_tmp else self.claim_tmp_paths(runnable)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        # docs/ write `ferry …` for an installed binary: the same one is first on PATH.
        (work / ".rt/bin").mkdir()
        os.symlink(work / ".build/debug/ferry", work / ".rt/bin/ferry")
        env["PATH"] = f"{work / '.rt/bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(self.avahi.env if self.avahi else {})
        shell = Shell(work, env, self.private_tmp)
        node = None  # (pid file, data directory) of the node `make run` started
        try:
            for name, bs in documents:
                if any(b in runnable for b in bs):
                    self.say(f"== {name}")
                for block in bs:
                    if not block.kind:
                        continue
                    if block.skip:
                        self.say(f"-- {block.where} [{block.section}] skipped: {block.skip}")
                        continue
                    self.say(f"-- {block.where} [{block.section}]")
                    try:
                        if node:
                            pending, node = node, None
                            self.wait_ready(work, *pending)
                        node = self.run_block(shell, block, work)
                        if node and block is runnable[-1]:
                            self.wait_ready(work, *node)
                        self.ran.append(block)
                    except Failure as e:
                        self.say(f"   FAILED: {e}")
                        self.failed.append((block, str(e).split("\n")[0]))
        finally:
            if not shell.stop():
                self.say("   note: processes needed SIGKILL")
                self.failed.append((Block("(cleanup)", 0, "", [], "", None), "processes left that SIGTERM did not stop"))
            for p in tmp_paths:
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else Path(p).unlink(missing_ok=True)

    def claim_tmp_paths(self, blocks):
        """Without a private /tmp: the /tmp paths the commands use must not exist yet."""
        paths = sorted({m for b in blocks for m in re.findall(r"/tmp/[A-Za-z0-9._-]+", b.text())})
        there = [p for p in paths if os.path.lexists(p)]
        if there:
            raise Failure(f"{', '.join(there)} already exist; the commands create them (remove them, or run as root for a private /tmp)")
        return paths

    def run_block(self, shell, block, work):
        if block.kind == "python":
            script = work / ".rt" / f"block-{block.line}.py"
            script.write_text(block.text() + "\n")
            self.run_command(shell, block, block.line + 1, f"python3 {shlex.quote(str(script))}", 0, None, block.text())
            return None
        cmds = commands(block)
        if [c[1].split("#")[0].strip() for c in cmds] == ["make run"]:
            # `make run` builds (FERRY_BIN is built already) and serves in that terminal.
            serve = makefile_run()
            pid_file = work / ".rt/make-run.pid"
            data = re.search(r"--data\s+(\S+)", serve)
            self.run_command(shell, block, cmds[0][0],
                             f"{serve} >{shlex.quote(str(work / '.rt/make-run.log'))} 2>&1 & echo $! >{shlex.quote(str(pid_file))}",
                             0, None, f"make run  ->  {serve} &")
            return pid_file, work / (data.group(1) if data else "ferry-data")
        for line, text, expected, within in cmds:
            self.run_command(shell, block, line, text, expected, within, text)
        return None

    def run_command(self, shell, block, line, text, expected, within, shown):
        started = time.monotonic()
        while True:
            try:
                rc, out = shell.run(text)
            except Failure as e:
                raise Failure(f"line {line}: {e}\n    $ {text}")
            took = time.monotonic() - started
            if rc == 0 or within is None or took > max(within, WITHIN_LIMIT):
                break
            time.sleep(0.1)
        error = None
        if rc != expected:
            error = f"exit {rc}" + (f", the doc says exit {expected}" if expected else "")
        elif text.lstrip().startswith("curl") and re.match(r'\s*\{\s*"error"\s*:', out):
            error = "the server answered with an error"
        status = f"exit {rc}" + (" (expected)" if expected and rc == expected else "")
        self.say(f"   {line}: {shown.splitlines()[0][:100]}{' …' if len(shown.splitlines()) > 1 else ''}  [{status}]")
        if within is not None and rc == 0 and took > within:
            self.say(f"   note: took {took:.1f} s; the doc says within {within:g} s")
        if self.verbose or error:
            self.say(indent(out))
        if error:
            self.say(f"   in the block at {block.where}:\n" + indent(block.text(), "    > "))
            raise Failure(f"line {line}: {error}\n    $ {text}\n{indent(out)}")

    def wait_ready(self, work, pid_file, data):
        """Until the node writes node.json and its admin API answers; never only a sleep."""
        deadline = time.monotonic() + READY_TIMEOUT
        pid = int(read(pid_file).strip() or 0)
        node_json = data / "node.json"
        while time.monotonic() < deadline:
            if not alive(pid):
                raise Failure("the node `make run` started exited:\n" + indent(read(work / ".rt/make-run.log")))
            try:
                url = json.loads(node_json.read_text()).get("adminURL")
            except (OSError, ValueError):
                url = None
            if url and answers(url):
                self.say(f"   node ready: {url}")
                return
            time.sleep(0.1)
        raise Failure(f"the node `make run` started was not ready within {READY_TIMEOUT} s:\n" + indent(read(work / ".rt/make-run.log")))

    def close(self):
        if self.avahi:
            self.avahi.stop()
        reap()
        if self.keep:
            print(f"readme-test: kept {self.base / 'repo'}", file=sys.stderr)
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def summary(self):
        self.say("\n== summary")
        self.say(f"blocks run: {len(self.ran)}, skipped: {len(self.skipped)}, failed: {len(self.failed)} "
                 f"({self.other} json/swift/text blocks are not commands)")
        for b, reason in self.skipped:
            self.say(f"  skipped {b.where} [{b.section}]: {reason}")
        for b, reason in self.failed:
            self.say(f"  FAILED  {b.where} [{b.section}]: {reason}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="print every command's output")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (the commands' outputs, the nodes' logs in .rt/)")
    ap.add_argument("files", nargs="*", help="Markdown files (default README.md and docs/*.md)")
    args = ap.parse_args()
    ferry_bin = os.environ.get("FERRY_BIN") or str(REPO / ".build/debug/ferry")
    names = args.files or ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))

    def interrupted(signum, _):
        raise KeyboardInterrupt(signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, interrupted)
    # Orphans of the documents' shells (a node started with `&`) are reparented here and reaped.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass

    runner = None
    try:
        if not os.access(ferry_bin, os.X_OK):
            raise Failure(f"no ferry binary at {ferry_bin} (build it, or set FERRY_BIN)")
        documents = [(n, parse(REPO / n if not os.path.isabs(n) else Path(n), n)) for n in names]
        check_ports()
        runner = Runner(ferry_bin, args.verbose, args.keep)
        if any(starts_node(b) for _, bs in documents for b in bs):
            runner.avahi = Avahi(runner.base)
        runner.run_all(documents)
        runner.summary()
        return 1 if runner.failed else 0
    except Failure as e:
        print(f"readme-test: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print("readme-test: interrupted", file=sys.stderr)
        return 128 + (e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT)
    finally:
        if runner:
            runner.close()


if __name__ == "__main__":
    sys.exit(main())

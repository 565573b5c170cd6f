"""Attacks on `ferry backup` and `ferry restore` through the real binary: a backup that
links out of itself (to a file, to a directory, in a loop) or holds a FIFO or a stray file,
and links planted in a live node's data directory.

Run by Integration/Scenarios/AttackBackupScenarios.swift against a running `ferry serve`
whose data directory is $FERRY_DATA (it holds documents and a blob), with the binary in
$FERRY_BIN and a scratch directory in $FERRY_ROOT. Backups are made as docs/operations.md
types them (`ferry --data DATA backup DEST`, node running) and restored with
`ferry --data DIR restore BACKUP`. Each attack asserts that:

- `ferry restore` exits non-zero and its error names the offending path;
- the target data directory is not created (nor an existing empty one written to);
- the secret the links point at is nowhere in what was written;
- `ferry backup` never follows a link planted in the data directory: a link where a file of
  the data directory belongs is refused by name, one outside the layout is left behind.

The secret is a file this test creates outside every backup; run as root, /etc/shadow is
linked too.
"""

import json
import os
import shutil
import subprocess
import threading
import uuid

import pytest

FERRY = os.environ["FERRY_BIN"]
DATA = os.environ["FERRY_DATA"]
ROOT = os.environ["FERRY_ROOT"]
SECRET = b"secret-4711-never-restored"


def ferry(*args, timeout=120):
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=timeout)


def fresh(name):
    return os.path.join(ROOT, f"{name}-{uuid.uuid4().hex[:8]}")


def make_backup():
    dest = fresh("backup")
    r = ferry("--data", DATA, "backup", dest)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(os.path.join(dest, "backup.json"))
    return dest


@pytest.fixture(scope="module")
def secret():
    directory = os.path.join(ROOT, "elsewhere")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "shadow")
    with open(path, "wb") as f:
        f.write(SECRET + b"\n")
    return path


def secrets_linked(secret):
    """The files the links point at: the test's own secret, and /etc/shadow as root."""
    targets = [secret]
    if os.geteuid() == 0 and os.path.isfile("/etc/shadow"):
        targets.append("/etc/shadow")
    return targets


def holds_secret(root):
    """Whether any regular file under `root` (links not followed) holds the secret."""
    for directory, _, files in os.walk(root, followlinks=False):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                if SECRET in f.read():
                    return True
    return False


def depth(root):
    deepest = 0
    for directory, _, _ in os.walk(root, followlinks=False):
        deepest = max(deepest, os.path.relpath(directory, root).count(os.sep) + 1)
    return deepest


def expect_refused(backup, path):
    """Restores `backup` into a new and into an empty directory: both refused naming `path`,
    nothing written to either."""
    target = fresh("restored")
    r = ferry("--data", target, "restore", backup)
    assert r.returncode != 0, f"restore exited 0: {r.stdout}"
    assert path in r.stderr, f"the error does not name {path}: {r.stderr}"
    exists = os.path.exists(target)
    leaked = exists and holds_secret(target)
    assert not exists, f"restore wrote {target} (secret inside: {leaked}, {depth(target)} levels deep)"

    empty = fresh("empty")
    os.makedirs(empty)
    r = ferry("--data", empty, "restore", backup)
    assert r.returncode != 0 and path in r.stderr, r.stderr
    assert os.listdir(empty) == [], f"restore wrote into {empty}: {os.listdir(empty)}"
    return r.stderr


def replace_with_link(path, destination):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    os.symlink(destination, path)


@pytest.mark.parametrize("which", [0, 1])
def test_a_link_to_a_file_outside_the_backup_is_refused_by_name(secret, which):
    targets = secrets_linked(secret)
    if which >= len(targets):
        pytest.skip("/etc/shadow is linked only as root")
    backup = make_backup()
    link = os.path.join(backup, "trust.json")
    replace_with_link(link, targets[which])
    stderr = expect_refused(backup, link)
    assert "symbolic link" in stderr, stderr


def test_a_link_to_a_directory_outside_the_backup_is_refused_by_name(secret):
    backup = make_backup()
    # An identity that would load, beside the secret, outside the backup.
    outside = fresh("outside-identity")
    shutil.copytree(os.path.join(backup, "identity"), outside)
    shutil.copy(secret, os.path.join(outside, "secret.txt"))
    link = os.path.join(backup, "identity")
    replace_with_link(link, outside)
    expect_refused(backup, link)


def test_a_link_loop_is_refused_by_name():
    backup = make_backup()
    loop = os.path.join(backup, "identity", "loop")
    os.symlink(".", loop)
    expect_refused(backup, loop)


class FifoFeeder:
    """A FIFO whose writer waits on a thread for one reader and then writes the secret: a
    restore that opened it would copy the secret rather than hang. `release` lets the writer
    finish when nothing opened it."""

    def __init__(self, path):
        self.path = path
        os.mkfifo(path, 0o600)
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self):
        with open(self.path, "wb") as f:
            f.write(SECRET + b"\n")

    def release(self):
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.thread.join()
        os.close(fd)


def test_a_fifo_is_refused_by_name_without_being_opened():
    backup = make_backup()
    fifo = os.path.join(backup, "couch-users.json")
    if os.path.exists(fifo):
        os.unlink(fifo)
    feeder = FifoFeeder(fifo)
    try:
        target = fresh("restored")
        r = ferry("--data", target, "restore", backup)
        assert r.returncode != 0, f"restore exited 0: {r.stdout}"
        assert fifo in r.stderr, r.stderr
        exists = os.path.exists(target)
        assert not exists, f"restore wrote {target} (secret inside: {exists and holds_secret(target)})"
    finally:
        feeder.release()


def test_a_file_outside_a_backups_layout_is_refused_by_name():
    backup = make_backup()
    stray = os.path.join(backup, "notes.txt")
    with open(stray, "w") as f:
        f.write("not part of a backup\n")
    stderr = expect_refused(backup, stray)
    assert "not part of a Ferry backup" in stderr, stderr


def test_an_untouched_backup_still_restores_and_checks():
    # Every file the running node keeps is part of the layout: nothing is left behind.
    backup = fresh("backup")
    r = ferry("--data", DATA, "--json", "backup", backup)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout).get("leftBehind", []) == [], r.stdout
    assert ferry("--data", backup, "check").returncode == 0
    target = fresh("restored")
    r = ferry("--data", target, "--json", "restore", backup, "--new-identity")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["documents"] >= 20
    r = ferry("--data", target, "check")
    assert r.returncode == 0, r.stderr


def test_backup_refuses_a_link_planted_where_a_data_file_belongs(secret):
    planted = os.path.join(DATA, "invitations.json")
    assert not os.path.lexists(planted), "the node has invitations: choose another name"
    os.symlink(secret, planted)
    try:
        dest = fresh("backup")
        r = ferry("--data", DATA, "backup", dest)
        assert r.returncode != 0, f"backup followed {planted}: {r.stdout}"
        assert planted in r.stderr, r.stderr
        assert not os.path.exists(dest)
        assert not [n for n in os.listdir(ROOT) if n.startswith(f".{os.path.basename(dest)}.backup-")]
    finally:
        os.unlink(planted)


def test_backup_leaves_links_outside_the_layout_behind_unfollowed(secret):
    escape = os.path.join(DATA, "escape")
    os.symlink(os.path.dirname(secret), escape)
    try:
        dest = fresh("backup")
        r = ferry("--data", DATA, "--json", "backup", dest)
        assert r.returncode == 0, r.stderr
        assert "escape" in json.loads(r.stdout).get("leftBehind", []), r.stdout
        assert not os.path.lexists(os.path.join(dest, "escape"))
        assert not holds_secret(dest)
        target = fresh("restored")
        assert ferry("--data", target, "restore", dest).returncode == 0
    finally:
        os.unlink(escape)

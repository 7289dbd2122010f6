"""SQLite persistence of the control plane: one row per live job and per group, a small
globals row, an append-only event log and the final records of departed jobs.

Contract
--------
* ``Store.open(path)`` takes an exclusive lock (``<path>.lock``, flock, beside the file
  that a symbolic link leads to): a second process on the same file, by any name a link
  gives it, gets ``StateLocked`` naming the holder's pid (a hard link is a second file
  as far as the lock knows: do not make one). A new path is
  created with mode 0600. An existing file must be a RollMux state file that passes
  SQLite's ``quick_check``, carries a known schema version and still has its
  write-ahead log when one was live; anything else raises ``StateDamaged`` with how to
  recover, as does a missing file whose write-ahead log is there (SQLite would delete
  it). ``new_state=True`` moves an existing file aside (``<path>.replaced-<time>``, its
  log merged in first) and starts empty: a fresh start is always explicit.
* Schema version ``SCHEMA_VERSION`` (3). Older files are migrated in one transaction on
  open (version 2: a single snapshot row, plaintext tokens).
* ``commit(changes)`` writes only what changed (``Changes``: upserted and deleted job
  and group rows, the globals, new events, departed records) in one transaction; its
  cost follows the size of the change, not of the state. With ``keep_events`` the log
  keeps the latest that many events (older ones are deleted in the same transaction;
  the sequence numbers of those kept do not change). When it returns the change
  survives a kill -9 (WAL, ``synchronous=NORMAL``). When it raises, nothing was written
  (the transaction is rolled back whatever the error).
* ``load()`` returns the state as ``{"cluster", "globals", "jobs", "groups"}`` (the
  shape of ``ControlPlane.snapshot()``), or None for a new file; a body that is not as
  a commit writes it (not JSON, NaN) is ``StateDamaged`` naming its row.
* ``backup(dst)`` writes a consistent copy while the service runs (SQLite backup API)
  and checks it.
* One ``Store`` is used from one thread at a time (the service serialises commits).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollmux.errors import RollMuxError

SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, ord INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (group_id TEXT PRIMARY KEY, ord INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, group_id TEXT NOT NULL,
    job_id TEXT NOT NULL, pool TEXT NOT NULL, nodes TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ended (n INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ended_job ON ended (job_id);
"""

_RECOVER = ("start with --new-state to move it aside and begin empty, or stop the service and restore a backup "
            "with `rollmux admin restore BACKUP --state {path}`")


class StoreError(RollMuxError):
    """Base of the state file's errors."""


class StateLocked(StoreError):
    """Another process holds the state file."""


class StateDamaged(StoreError):
    """The state file is not a usable RollMux state file; the message says how to recover."""


class CommitFailed(StoreError):
    """A commit could not be written (disk full, I/O error); nothing was written."""


@dataclass(slots=True)
class Changes:
    """One commit's worth of change (see ``ControlPlane.take_changes``)."""

    globals: dict
    jobs: dict[str, tuple[int, dict]] = field(default_factory=dict)      # job_id -> (ord, row)
    jobs_deleted: list[str] = field(default_factory=list)
    groups: dict[str, tuple[int, dict]] = field(default_factory=dict)    # group_id -> (ord, row)
    groups_deleted: list[str] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    ended: list[dict] = field(default_factory=list)
    cluster: dict | None = None                                           # set when the cluster changed

    def empty(self) -> bool:
        return not (self.jobs or self.jobs_deleted or self.groups or self.groups_deleted or self.events
                    or self.ended or self.cluster is not None)


def hash_token(token: str) -> str:
    """The stored form of a bearer token (SHA-256, hex)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _no_constant(name: str):
    """``json.loads``'s hook for NaN and Infinity, which ``_dumps`` never writes."""
    raise ValueError(f"{name} is not a number a commit writes")


class Store:
    """The service's state file (see the module docstring). Use ``Store.open``."""

    def __init__(self, path: str | Path, db: sqlite3.Connection, lock_fd: int | None, created: bool,
                 keep_events: int | None = None) -> None:
        self.path = str(path)
        self._db = db
        self._lock_fd = lock_fd
        self.created = created
        self.keep_events = keep_events

    # --- opening ------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, new_state: bool = False, lock: bool = True,
             keep_events: int | None = None) -> "Store":
        path = Path(path)
        lock_fd = _lock(path) if lock else None
        try:
            if new_state and path.exists():
                aside(path)
            created = not path.exists()
            wal = Path(f"{path}-wal")
            if created and wal.exists() and wal.stat().st_size > 0:
                raise StateDamaged(f"{path}: missing, but its write-ahead log {path.name}-wal is there: the last "
                                   f"changes of a state file that was moved or deleted without it (by hand, or "
                                   f"by an older rollmux's --new-state killed half-way, which left "
                                   f"{path.name}.replaced-TIME without its -wal). Put the log back beside its "
                                   f"file (rename it to that file's name + '-wal'), or delete it to start empty; "
                                   f"starting here would delete it")
            if not created:
                check_header(path)
                if not wal.exists() and _flag_open(path):
                    raise StateDamaged(f"{path}: the state file was in use but its write-ahead log "
                                       f"({path.name}-wal) is missing, so its last changes are lost; "
                                       + _RECOVER.format(path=path))
            old = os.umask(0o077)
            try:
                db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            store = cls(path, db, lock_fd, created, keep_events)
            store._prepare()
            return store
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise

    def _prepare(self) -> None:
        db = self._db
        try:
            version = SCHEMA_VERSION
            if not self.created:  # checks first: a refused file is left exactly as it was
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise StateDamaged(f"{self.path}: SQLite integrity check failed ({check}); "
                                       + _RECOVER.format(path=self.path))
                version = self._version()
                if version > SCHEMA_VERSION:
                    raise StateDamaged(f"{self.path}: schema version {version} was written by a newer rollmux "
                                       f"(this one knows up to {SCHEMA_VERSION}); upgrade rollmux")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            if self.created:
                db.executescript(_SCHEMA)
                db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif version < SCHEMA_VERSION:
                if version not in _MIGRATIONS:
                    raise StateDamaged(f"{self.path}: schema version {version} is not one this rollmux reads "
                                       f"(it migrates {sorted(_MIGRATIONS)} to {SCHEMA_VERSION}); "
                                       + _RECOVER.format(path=self.path))
                _MIGRATIONS[version](db)
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('open', '1')")
            db.execute("PRAGMA wal_checkpoint(FULL)")
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StateDamaged(f"{self.path}: not a readable RollMux state file ({exc}); "
                               + _RECOVER.format(path=self.path)) from exc
        except BaseException:
            db.close()
            raise

    def _version(self) -> int:
        return schema_version(self._db, self.path)

    # --- reads ---------------------------------------------------------------------------
    def load(self) -> dict | None:
        """The committed state, or None when nothing was ever committed."""
        db = self._db
        meta = dict(db.execute("SELECT key, value FROM meta"))
        if "globals" not in meta:
            return None
        return {
            "cluster": self._loads(meta.get("cluster"), "meta 'cluster'"),
            "globals": self._loads(meta["globals"], "meta 'globals'"),
            "jobs": {j: self._loads(b, f"jobs row {j!r}")
                     for j, b in db.execute("SELECT job_id, body FROM jobs ORDER BY ord")},
            "groups": {g: self._loads(b, f"groups row {g!r}")
                       for g, b in db.execute("SELECT group_id, body FROM groups ORDER BY ord")},
        }

    def _loads(self, text: str | None, where: str):
        """A stored body as the commits wrote it (``_dumps``); anything else (not JSON, NaN
        or Infinity, nested past the parser's depth, missing) is ``StateDamaged`` naming it."""
        try:
            if text is None:
                raise ValueError("missing")
            return json.loads(text, parse_constant=_no_constant)
        except (ValueError, TypeError, RecursionError) as exc:
            raise StateDamaged(f"{self.path}: {where} is not as a commit writes it ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); " + _RECOVER.format(path=self.path)) from None

    def last_event_seq(self) -> int:
        """The highest sequence number in the event log (0 when it is empty)."""
        return self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

    def ended(self, last: int | None = None) -> list[dict]:
        """Every departed job's final record, in departure order (the ``last`` latest ones only)."""
        if last is None:
            rows = self._db.execute("SELECT n, body FROM ended ORDER BY n").fetchall()
        else:
            rows = self._db.execute("SELECT n, body FROM ended ORDER BY n DESC LIMIT ?", (last,)).fetchall()[::-1]
        return [self._loads(b, f"ended row {n}") for n, b in rows]

    def ended_counts(self, last: int) -> dict[str, int]:
        """Departed records by state, leaving out the ``last`` latest departures (which
        ``Store.ended(last)`` returns)."""
        cut = self._db.execute("SELECT n FROM ended ORDER BY n DESC LIMIT 1 OFFSET ?", (last,)).fetchone()
        if cut is None:  # at most ``last`` departures
            return {}
        rows = self._db.execute("SELECT json_extract(body, '$.state'), COUNT(*) FROM ended WHERE n <= ? GROUP BY 1",
                                (cut[0],))
        return {state: count for state, count in rows}

    def ended_record(self, job_id: str, match=None) -> dict | None:
        """The final record of ``job_id``'s latest departed run (with ``match``, the latest
        for which ``match(record)`` holds), or None."""
        for (body,) in self._db.execute("SELECT body FROM ended WHERE job_id = ? ORDER BY n DESC", (job_id,)):
            record = json.loads(body)
            if match is None or match(record):
                return record
        return None

    def events(self, since: int = 0, limit: int = 100_000) -> list[dict]:
        """The log after sequence number ``since``, oldest first."""
        rows = self._db.execute(
            "SELECT seq, at, kind, group_id, job_id, pool, nodes, detail FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (since, limit)).fetchall()
        return [{"seq": s, "at": at, "kind": k, "group_id": g, "job_id": j, "pool": p, "nodes": json.loads(n),
                 "detail": json.loads(d)} for s, at, k, g, j, p, n, d in rows]

    def dump(self) -> str:
        """Every committed row as canonical text (tests compare it before and after a refusal)."""
        db = self._db
        parts = []
        for table, key in (("meta", "key"), ("jobs", "job_id"), ("groups", "group_id"), ("events", "seq"),
                           ("ended", "n")):
            rows = db.execute(f"SELECT * FROM {table} ORDER BY {key}").fetchall()  # noqa: S608 - fixed names
            if table == "meta":
                rows = [r for r in rows if r[0] != "open"]
            parts.append(f"{table}:{rows!r}")
        return "\n".join(parts)

    # --- writes --------------------------------------------------------------------------
    def commit(self, changes: Changes) -> None:
        """Write ``changes`` in one transaction; ``CommitFailed`` means nothing was written."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise CommitFailed(f"{self.path}: {exc}") from exc
        try:
            if changes.cluster is not None:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('cluster', ?)",
                           (_dumps(changes.cluster),))
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('globals', ?)", (_dumps(changes.globals),))
            if changes.jobs_deleted:
                db.executemany("DELETE FROM jobs WHERE job_id = ?", [(j,) for j in changes.jobs_deleted])
            if changes.jobs:
                db.executemany("INSERT OR REPLACE INTO jobs (job_id, ord, body) VALUES (?, ?, ?)",
                               [(j, o, _dumps(b)) for j, (o, b) in changes.jobs.items()])
            if changes.groups_deleted:
                db.executemany("DELETE FROM groups WHERE group_id = ?", [(g,) for g in changes.groups_deleted])
            if changes.groups:
                db.executemany("INSERT OR REPLACE INTO groups (group_id, ord, body) VALUES (?, ?, ?)",
                               [(g, o, _dumps(b)) for g, (o, b) in changes.groups.items()])
            if changes.events:
                db.executemany(
                    "INSERT INTO events (seq, at, kind, group_id, job_id, pool, nodes, detail) VALUES (?,?,?,?,?,?,?,?)",
                    [(e["seq"], e["at"], e["kind"], e["group_id"], e["job_id"], e["pool"], _dumps(e["nodes"]),
                      _dumps(e["detail"])) for e in changes.events])
                if self.keep_events is not None:
                    db.execute("DELETE FROM events WHERE seq <= ?", (changes.events[-1]["seq"] - self.keep_events,))
            if changes.ended:
                db.executemany("INSERT INTO ended (job_id, body) VALUES (?, ?)",
                               [(r["job"]["job_id"], _dumps(r)) for r in changes.ended])
            db.execute("COMMIT")
        except BaseException as exc:  # whatever it was (an int over SQLite's 64 bits too): nothing is written
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if isinstance(exc, (sqlite3.Error, ValueError, OSError)):
                raise CommitFailed(f"{self.path}: {exc}") from exc
            if isinstance(exc, Exception):
                raise CommitFailed(f"{self.path}: {type(exc).__name__}: {exc}") from exc
            raise

    def backup(self, dst: str | Path) -> None:
        """A consistent copy of the committed state at ``dst`` (0600), checked after writing."""
        backup(self._db, dst)

    def close(self) -> None:
        """Mark a clean shutdown, checkpoint (the WAL goes away) and release the lock."""
        try:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('open', '0')")
        except sqlite3.Error:
            pass
        self._db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def schema_version(db: sqlite3.Connection, path: Path) -> int:
    """The RollMux schema version of an open SQLite file; StateDamaged if it is not a
    RollMux state file (another program's SQLite database)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" in tables:
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and row[0].isdigit():
            return int(row[0])
    if tables == {"snapshot", "events", "ended", "sqlite_sequence"} or tables == {"snapshot", "events", "ended"}:
        return 2
    raise StateDamaged(f"{path}: not a RollMux state file (tables: {sorted(tables) or 'none'}); "
                       + _RECOVER.format(path=path))


def backup(db: sqlite3.Connection, dst: str | Path) -> None:
    """Copy ``db`` to ``dst`` with SQLite's online backup; refuses to overwrite a file. A
    backup that fails (a folder that does not exist, a full disk) is a StoreError naming
    ``dst``, and leaves no file there."""
    dst = Path(dst)
    if dst.exists():
        raise StoreError(f"{dst}: exists; give a new file name for the backup")
    old = os.umask(0o077)
    try:
        out = sqlite3.connect(str(dst))
    except sqlite3.Error as err:
        raise StoreError(f"{dst}: cannot write the backup there ({err})") from None
    finally:
        os.umask(old)
    try:
        db.backup(out)
        if out.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
            out.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('open', '0')")
        out.commit()
        check = out.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise StoreError(f"{dst}: the backup failed its integrity check ({check})")
    except (sqlite3.Error, OSError, StoreError) as err:
        out.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{dst}{suffix}").unlink(missing_ok=True)
        if isinstance(err, StoreError):
            raise
        raise StoreError(f"{dst}: the backup could not be written ({err})") from None
    out.close()


def backup_file(state: str | Path, dst: str | Path) -> None:
    """Online backup of the state file at ``state`` (a running service may hold it)."""
    state = Path(state)
    check_header(state, advice=False)
    src = sqlite3.connect(f"file:{state}?mode=ro", uri=True)
    try:
        schema_version(src, state)
        backup(src, dst)
    finally:
        src.close()


def restore_file(backup_path: str | Path, state: str | Path) -> Path | None:
    """Put a backup in place of ``state`` (no service may hold it); the old file is moved
    aside and its new name returned (None if there was none). A backup that is not a
    sound RollMux state file is refused with nothing changed; the backup is copied next
    to ``state`` first, so the old file is moved aside only once the copy is whole. A
    ``state`` that is a folder, or under a folder that does not exist, is refused."""
    backup_path, state = Path(backup_path), Path(state)
    check_header(backup_path, advice=False)
    if state.is_dir():
        raise StoreError(f"{state}: a folder, not a state file; give the state file's path (e.g. "
                         f"{state / 'state.db'})")
    if not state.parent.is_dir():
        raise StoreError(f"{state}: its folder {state.parent} does not exist (or is not a folder)")
    fd = _lock(state)
    try:
        src = sqlite3.connect(f"file:{backup_path}?mode=ro", uri=True)
        try:
            check = src.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StateDamaged(f"{backup_path}: integrity check failed ({check}); not restored")
            schema_version(src, backup_path)
            staged = Path(f"{state}.restoring")
            for suffix in ("", "-journal"):
                Path(f"{staged}{suffix}").unlink(missing_ok=True)  # (a restore killed before)
            backup(src, staged)
            moved = None
            if state.exists():
                moved = aside(state)
            staged.rename(state)
            return moved
        finally:
            src.close()
    finally:
        os.close(fd)


def aside(state: Path) -> Path:
    """Move ``state`` (and its -wal and -shm) to ``STATE.replaced-TIME``, a name no file
    has (``-2``, ``-3``, ... within one second); returns it. A sound state file's log is
    first merged into it and the file marked closed (``_settle``), so the moved file is
    whole on its own: a crash between the renames left the log behind, and a start on
    the old name then deleted it with the last changes."""
    _settle(state)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved, n = Path(f"{state}.replaced-{stamp}"), 1
    while any(Path(f"{moved}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
        n += 1
        moved = Path(f"{state}.replaced-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        p = Path(f"{state}{suffix}")
        if p.exists():
            p.rename(f"{moved}{suffix}")
    return moved


# --- helpers -----------------------------------------------------------------------------
def _lock(path: Path) -> int:
    """Take ``path``'s lock: ``<real path>.lock``, named after the file a symbolic link leads
    to, so that a second process reaching the file by another name finds it taken."""
    lock_path = Path(f"{path.resolve()}.lock")
    old = os.umask(0o077)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    finally:
        os.umask(old)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateLocked(f"{path}: held by another rollmux process (pid {holder}); stop it first, or give "
                          f"this one its own --state file") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def check_header(path: Path, advice: bool = True) -> None:
    """Refuse (``StateDamaged``) a file that is not an SQLite database, reading 16 bytes only;
    ``advice``: say how a service's state file is recovered (not for a file that is only read,
    such as a backup to restore)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise StateDamaged(f"{path}: cannot be read ({exc})") from exc
    if head != b"SQLite format 3\x00":
        what = "empty (0 bytes)" if not head else "not an SQLite database"
        raise StateDamaged(f"{path}: {what}; " + (_RECOVER.format(path=path) if advice else
                                                  "expected a RollMux state file or a backup of one"))


def _settle(path: Path) -> None:
    """Checkpoint ``path``'s write-ahead log into it and mark it closed, when it is a
    sound RollMux state file; a file that is not is left exactly as it is."""
    if not Path(f"{path}-wal").exists():
        return
    try:
        check_header(path)
        db = sqlite3.connect(str(path), isolation_level=None)
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return
            schema_version(db, path)
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('open', '0')")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    except (sqlite3.Error, StoreError):
        return


def _flag_open(path: Path) -> bool:
    """Whether the main file says a service had it open (read without touching the WAL)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key='open'").fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False
    return row is not None and row[0] == "1"


def _migrate_v2(db: sqlite3.Connection) -> None:
    """Version 2 (one snapshot row, plaintext tokens, leases in the records) -> 3."""
    from rollmux.runtime.control import snapshot_from_v2

    db.execute("BEGIN IMMEDIATE")
    try:
        row = db.execute("SELECT body FROM snapshot WHERE id = 1").fetchone()
        ended = [json.loads(b) for (b,) in db.execute("SELECT body FROM ended ORDER BY n")]
        db.execute("ALTER TABLE ended RENAME TO ended_v2")
        for statement in filter(str.strip, _SCHEMA.split(";")):
            db.execute(statement)
        db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        if row is not None:
            snap, ended3 = snapshot_from_v2(json.loads(row[0]), ended)
            db.execute("INSERT INTO meta (key, value) VALUES ('cluster', ?)", (_dumps(snap["cluster"]),))
            db.execute("INSERT INTO meta (key, value) VALUES ('globals', ?)", (_dumps(snap["globals"]),))
            db.executemany("INSERT INTO jobs (job_id, ord, body) VALUES (?, ?, ?)",
                           [(j, b["ord"], _dumps(b)) for j, b in snap["jobs"].items()])
            db.executemany("INSERT INTO groups (group_id, ord, body) VALUES (?, ?, ?)",
                           [(g, b["ord"], _dumps(b)) for g, b in snap["groups"].items()])
            db.executemany("INSERT INTO ended (job_id, body) VALUES (?, ?)",
                           [(r["job"]["job_id"], _dumps(r)) for r in ended3])
        db.execute("DROP TABLE ended_v2")
        db.execute("DROP TABLE snapshot")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


_MIGRATIONS = {2: _migrate_v2}

"""SQLite persistence of the control plane: one snapshot row of the live state, an
append-only event log and the final records of departed jobs.

Contract
--------
* ``commit(snapshot, events, ended)`` writes the new snapshot, appends the events and
  the departed jobs' records in one transaction; when it returns, the change survives the process being killed (WAL
  journal, ``synchronous=NORMAL``: a committed transaction is in the WAL file before
  ``commit`` returns; only an operating-system crash could lose the last ones).
* ``load()`` returns the last committed snapshot, or None for a new file; ``ended()``
  every departed job's final record, in departure order.
* ``events(since)`` returns the log after sequence number ``since``, oldest first. The log
  is the service's grant record: every admit, grant, finish and remove with its time.
* One ``Store`` is used from one thread at a time (the service's event loop).
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, group_id TEXT NOT NULL,
    job_id TEXT NOT NULL, pool TEXT NOT NULL, nodes TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ended (n INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT NULL, body TEXT NOT NULL);
"""


class Store:
    """The service's state file (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def load(self) -> dict | None:
        row = self._db.execute("SELECT body FROM snapshot WHERE id = 1").fetchone()
        return json.loads(row[0]) if row else None

    def ended(self) -> list[dict]:
        return [json.loads(b) for (b,) in self._db.execute("SELECT body FROM ended ORDER BY n")]

    def commit(self, snapshot: dict, events: list[dict], ended: list[dict] = ()) -> None:
        body = json.dumps(snapshot, separators=(",", ":"))
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT OR REPLACE INTO snapshot (id, body) VALUES (1, ?)", (body,))
            db.executemany(
                "INSERT INTO events (seq, at, kind, group_id, job_id, pool, nodes, detail) VALUES (?,?,?,?,?,?,?,?)",
                [(e["seq"], e["at"], e["kind"], e["group_id"], e["job_id"], e["pool"], json.dumps(e["nodes"]),
                  json.dumps(e["detail"])) for e in events])
            db.executemany("INSERT INTO ended (job_id, body) VALUES (?, ?)",
                           [(r["job"]["job_id"], json.dumps(r, separators=(",", ":"))) for r in ended])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def events(self, since: int = 0, limit: int = 100_000) -> list[dict]:
        rows = self._db.execute(
            "SELECT seq, at, kind, group_id, job_id, pool, nodes, detail FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (since, limit)).fetchall()
        return [{"seq": s, "at": at, "kind": k, "group_id": g, "job_id": j, "pool": p, "nodes": json.loads(n),
                 "detail": json.loads(d)} for s, at, k, g, j, p, n, d in rows]

    def close(self) -> None:
        self._db.close()

"""The state file: rows that follow the change, an oracle against the full snapshot,
the lock, integrity checks on damaged files, migration, full disk, backup and restore."""
from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.control import PLACED, ControlPlane
from rollmux.runtime.store import (CommitFailed, StateDamaged, StateLocked, Store, StoreError, backup_file,
                                   hash_token, restore_file)

DATA = Path(__file__).parent / "data"


def _cluster(nodes: int | None = None) -> Cluster:
    return Cluster(rollout=PoolSpec("H20", 1.85, nodes=nodes), train=PoolSpec("H800", 5.28, nodes=nodes),
                   switch_cost=SwitchCost("fixed"))


def _job(job_id: str, t: float = 10.0, iterations: int | None = 3) -> Job:
    return Job(job_id, t, t, slo=2.0, iterations=iterations)


def _roundtrip(obj):
    return json.loads(json.dumps(obj))


def _random_ops(cp: ControlPlane, store: Store, rng: random.Random, steps: int) -> None:
    """Random submits, phases, progress, cancels, expiries and drains; commit after each;
    the committed state must equal the full in-memory snapshot every time."""
    now = 0.0
    for step in range(steps):
        now += rng.uniform(0.0, 5.0)
        live = [r for r in cp.jobs.values() if r.live]
        op = rng.random()
        try:
            if op < 0.3 or not live:
                cp.submit(_job(f"j{step}", rng.choice([4.0, 10.0, 30.0]), rng.choice([1, 2, 4, None])), now,
                          hash_token(f"t{step}"))
            elif op < 0.75:
                rec = rng.choice(live)
                if rec.grant is not None:
                    cp.release(rec.job_id, rec.grant.pool, rec.grant.seq, 1.0, now)
            elif op < 0.8:
                cp.report_progress(rng.choice(live).job_id, rng.random())
            elif op < 0.87:
                cp.cancel(rng.choice(live).job_id, now)
            elif op < 0.94:
                cp.expire([rng.choice(live).job_id], now, "silent")
            elif cp.plan.bounded("rollout"):
                node = rng.choice(["R0", "R1", "R2"])
                (cp.drain if rng.random() < 0.5 else cp.undrain)(node, now)
        except Exception as exc:  # the plane refuses (e.g. duplicate): nothing may have changed
            assert type(exc).__name__ in {"DuplicateJob", "NeverFits"}, exc
        store.commit(cp.take_changes())
        assert store.load() == _roundtrip(cp.snapshot()), f"step {step}: the file differs from memory"
        for pool in ("rollout", "train"):  # the kept count against a recount of the groups
            assert cp.plan.nodes_in_use(pool) == sum(len(g.nodes(pool)) for g in cp.plan.groups.values())


@pytest.mark.parametrize("nodes,seed", [(None, 0), (None, 1), (3, 2), (3, 3)])
def test_committed_rows_always_equal_the_full_snapshot(tmp_path, nodes, seed):
    cp = ControlPlane(_cluster(nodes))
    store = Store.open(tmp_path / "s.db")
    store.commit(cp.take_changes())
    _random_ops(cp, store, random.Random(seed), 150)
    restored = ControlPlane.restore(store.load(), store.ended())
    assert restored.snapshot() == cp.snapshot()
    assert {j: r.state for j, r in restored.jobs.items()} == {j: r.state for j, r in cp.jobs.items()}
    store.close()


def _rows_written_by_one_release(tmp_path: Path, live_jobs: int) -> int:
    cp = ControlPlane(_cluster())
    for i in range(live_jobs):
        cp.submit(_job(f"j{i}", iterations=None), 0.0, hash_token(str(i)))
    store = Store.open(tmp_path / f"rows{live_jobs}.db")
    store.commit(cp.take_changes())
    rec = next(r for r in cp.jobs.values() if r.grant is not None)
    cp.release(rec.job_id, rec.grant.pool, rec.grant.seq, 1.0, 5.0)
    changes = cp.take_changes()
    store.commit(changes)
    store.close()
    return len(changes.jobs) + len(changes.groups) + len(changes.events)


def test_a_commit_writes_the_change_not_the_state(tmp_path):
    small, large = _rows_written_by_one_release(tmp_path, 10), _rows_written_by_one_release(tmp_path, 300)
    assert small == large and small <= 6


def test_a_second_process_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "s.db"
    first = Store.open(path)
    with pytest.raises(StateLocked, match=f"pid {os.getpid()}"):
        Store.open(path)
    first.close()
    Store.open(path).close()  # free again once the holder is gone


def test_a_second_process_reaching_the_file_through_a_symbolic_link_is_refused(tmp_path):
    """(the lock was named after --state as typed: a server on link.db and one on real.db
    both ran, and their contradicting changes left a file that no longer loaded)"""
    real = tmp_path / "real.db"
    first = Store.open(real)
    (tmp_path / "link.db").symlink_to("real.db")
    (tmp_path / "dir-link").symlink_to(tmp_path)
    for other in (tmp_path / "link.db", tmp_path / "dir-link" / "real.db"):
        with pytest.raises(StateLocked, match=f"pid {os.getpid()}"):
            Store.open(other)
    with pytest.raises(StateLocked):
        restore_file(real, tmp_path / "link.db")
    first.close()


def test_files_are_private(tmp_path):
    store = Store.open(tmp_path / "s.db")
    store.commit(ControlPlane(_cluster()).take_changes())
    for name in ("s.db", "s.db-wal", "s.db.lock"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode & 0o077 == 0, f"{name} is {oct(mode)}"
    store.close()


def _committed_file(tmp_path: Path, close: bool = True) -> tuple[Path, Store]:
    cp = ControlPlane(_cluster(2))
    store = Store.open(tmp_path / "s.db")
    store.commit(cp.take_changes())
    cp.submit(_job("a"), 1.0, hash_token("a"))
    store.commit(cp.take_changes())
    if close:
        store.close()
    return tmp_path / "s.db", store


def _damage_zero(path: Path) -> None:
    path.write_bytes(b"")


def _damage_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _damage_pages(path: Path) -> None:
    data = bytearray(path.read_bytes())
    rng = random.Random(7)
    for page in range(1, len(data) // 4096):
        for _ in range(64):
            data[page * 4096 + rng.randrange(4096)] = rng.randrange(256)
    path.write_bytes(bytes(data))


def _damage_foreign(path: Path) -> None:
    path.unlink()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE photos (id INTEGER)")
    db.commit()
    db.close()


@pytest.mark.parametrize("damage", [_damage_zero, _damage_garbage, _damage_pages, _damage_foreign])
def test_a_damaged_file_refuses_to_start_and_is_left_as_it_is(tmp_path, damage):
    path, _ = _committed_file(tmp_path)
    damage(path)
    before = path.read_bytes()
    with pytest.raises(StateDamaged, match="--new-state|restore"):
        Store.open(path)
    assert path.read_bytes() == before
    fresh = Store.open(path, new_state=True)
    assert fresh.load() is None and list(tmp_path.glob("s.db.replaced-*"))
    fresh.close()


def test_a_copy_without_its_write_ahead_log_is_refused(tmp_path):
    path, store = _committed_file(tmp_path, close=False)  # a running service, as kill -9 leaves it
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(path, copy / "s.db")
    store.close()
    with pytest.raises(StateDamaged, match="write-ahead log"):
        Store.open(copy / "s.db")


def _killed_file(path: Path, jobs: int = 3) -> None:
    """A state file as a kill -9 leaves it: its last commits in the write-ahead log."""
    script = (f"from rollmux.runtime.store import Store, hash_token\n"
              f"from rollmux.runtime.control import ControlPlane\n"
              f"from rollmux.model import Cluster, Job\n"
              f"import os, signal\n"
              f"cp = ControlPlane(Cluster()); s = Store.open({str(path)!r}); s.commit(cp.take_changes())\n"
              f"for i in range({jobs}):\n"
              f"    cp.submit(Job(f'a{{i}}', 10.0, 10.0, slo=2.0), 1.0, hash_token('a')); s.commit(cp.take_changes())\n"
              f"os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([os.sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    assert Path(f"{path}-wal").stat().st_size > 0


def test_a_killed_service_leaves_a_file_that_opens_with_everything(tmp_path):
    _killed_file(tmp_path / "s.db", jobs=1)
    store = Store.open(tmp_path / "s.db")
    assert store.load()["jobs"]["a0"]["state"] == PLACED
    store.close()


def _v2_file(path: Path) -> dict:
    """A state file as version 2 wrote it (schema and rows from a recorded run of that version)."""
    dump = json.loads((DATA / "state_v2.json").read_text())
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL);
        CREATE TABLE events (seq INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, group_id TEXT NOT NULL,
                             job_id TEXT NOT NULL, pool TEXT NOT NULL, nodes TEXT NOT NULL, detail TEXT NOT NULL);
        CREATE TABLE ended (n INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT NULL, body TEXT NOT NULL);
    """)
    db.execute("INSERT INTO snapshot VALUES (1, ?)", (json.dumps(dump["snapshot"]),))
    db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?)",
                   [tuple(e.values()) for e in dump["events"]])
    db.executemany("INSERT INTO ended (job_id, body) VALUES (?, ?)",
                   [(r["job"]["job_id"], json.dumps(r)) for r in dump["ended"]])
    db.commit()
    db.close()
    return dump


def test_a_version_2_file_is_migrated_with_its_jobs_grants_and_tokens(tmp_path):
    dump = _v2_file(tmp_path / "s.db")
    store = Store.open(tmp_path / "s.db")
    cp = ControlPlane.restore(store.load(), store.ended())
    old = {d["job"]["job_id"]: d for d in dump["snapshot"]["jobs"]}
    assert {j for j, r in cp.jobs.items() if r.live} == set(old)
    for job_id, d in old.items():
        rec = cp.record(job_id)
        assert rec.token_hash == hash_token(d["token"]), "tokens are kept, hashed"
        assert (rec.state, rec.group_id, rec.iterations_done) == (d["state"], d["group_id"], d["iterations_done"])
        assert (rec.grant.seq if rec.grant else None) == (d["grant"]["seq"] if d["grant"] else None)
    assert [r["job"]["job_id"] for r in store.ended()] == [r["job"]["job_id"] for r in dump["ended"]]
    assert [e["seq"] for e in store.events()] == [e["seq"] for e in dump["events"]]
    assert "token" not in json.dumps(store.load()).replace("token_hash", "")
    # the migrated plane carries on: the holder of a grant can release it
    holder = next(r for r in cp.jobs.values() if r.live and r.grant is not None)
    cp.release(holder.job_id, holder.grant.pool, holder.grant.seq, 1.0, dump["snapshot"]["clock"] + 1)
    store.commit(cp.take_changes())
    assert store.load() == _roundtrip(cp.snapshot())
    store.close()


def test_a_full_disk_fails_the_commit_and_writes_nothing(tmp_path):
    cp = ControlPlane(_cluster())
    store = Store.open(tmp_path / "s.db")
    store.commit(cp.take_changes())
    store._db.execute("PRAGMA max_page_count = 1")  # the file cannot grow: SQLITE_FULL, as on a full disk
    before = store.dump()
    for i in range(40):
        cp.submit(Job(f"big{i}", 10.0, 10.0, slo=2.0, model="x" * 100), 1.0, hash_token(str(i)))
    with pytest.raises(CommitFailed, match="full"):
        store.commit(cp.take_changes())
    assert store.dump() == before
    store.close()


def test_a_full_tmpfs_fails_the_commit_and_writes_nothing(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        cp = ControlPlane(_cluster())
        store = Store.open(mount / "s.db")
        store.commit(cp.take_changes())
        before = store.dump()
        failed = False
        for batch in range(200):
            for i in range(20):
                cp.submit(Job(f"b{batch}-{i}", 10.0, 10.0, slo=2.0, model="m" * 120), 1.0, hash_token("x"))
            changes = cp.take_changes()
            try:
                store.commit(changes)
                before = store.dump()
            except CommitFailed:
                failed = True
                break
        assert failed, "the tmpfs never filled up"
        assert store.dump() == before
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_online_backup_and_restore(tmp_path):
    path, store = _committed_file(tmp_path, close=False)
    backup_file(path, tmp_path / "b.db")  # while the service holds the file
    with pytest.raises(StoreError, match="exists"):
        backup_file(path, tmp_path / "b.db")
    with pytest.raises(StateLocked):
        restore_file(tmp_path / "b.db", path)  # not while it runs
    expected = store.load()
    store.close()
    moved = restore_file(tmp_path / "b.db", path)
    assert moved is not None and moved.exists()
    again = Store.open(path)
    assert again.load() == expected
    again.close()


def test_a_restore_onto_a_folder_or_under_a_missing_one_is_refused_with_nothing_moved(tmp_path):
    """(``admin restore B --state DIR`` renamed the whole folder, a running service's state
    file, log and lock inside, and put the backup in its place)"""
    path, store = _committed_file(tmp_path, close=False)
    backup_file(path, tmp_path / "b.db")
    store.close()
    (tmp_path / "jobs.yaml").write_text("job_id: a\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StoreError, match="a folder, not a state file"):
        restore_file(tmp_path / "b.db", tmp_path)
    with pytest.raises(StoreError, match="does not exist"):
        restore_file(tmp_path / "b.db", tmp_path / "missing" / "s.db")
    with pytest.raises(StateDamaged, match="expected a RollMux state file or a backup") as err:
        restore_file(tmp_path / "jobs.yaml", path)
    assert "--new-state" not in str(err.value)  # (the advice for a service's own file, not a backup's)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_restore_of_another_programs_sqlite_file_changes_nothing(tmp_path):
    """It moved the state aside, left the foreign database as the state file, then crashed."""
    path, store = _committed_file(tmp_path)
    before = path.read_bytes()
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(StateDamaged, match="not a RollMux state file"):
        restore_file(foreign, path)
    assert path.read_bytes() == before and not list(tmp_path.glob("*.replaced-*"))
    with pytest.raises(StateDamaged, match="not a RollMux state file"):
        backup_file(foreign, tmp_path / "copy.db")
    assert not (tmp_path / "copy.db").exists()


def test_two_restores_in_one_second_keep_every_old_file(tmp_path):
    """Both moved the old file to the same STATE.replaced-<second>: the first one was lost."""
    path, store = _committed_file(tmp_path)
    backup_file(path, tmp_path / "b.db")
    first = restore_file(tmp_path / "b.db", path)
    second = restore_file(tmp_path / "b.db", path)
    third = Store.open(path, new_state=True)  # (--new-state moves it aside the same way)
    third.close()
    moved = sorted(tmp_path.glob("s.db.replaced-*"))
    assert len({first, second}) == 2 and len([m for m in moved if not m.name.endswith(("-wal", "-shm"))]) == 3


def test_a_backup_that_cannot_be_written_is_an_error_and_leaves_no_file(tmp_path):
    path, store = _committed_file(tmp_path)
    with pytest.raises(StoreError, match="cannot write the backup there"):
        backup_file(path, tmp_path / "missing" / "b.db")
    assert not (tmp_path / "missing").exists()


def test_new_state_killed_between_its_renames_loses_nothing(tmp_path, monkeypatch):
    """``--new-state`` moved the file, then its log, aside; a kill between the two renames
    left the log on the old name, a plain restart started empty and SQLite deleted the log
    with the last acknowledged jobs. The log is now merged into the file before it moves,
    so the moved file is whole alone, and a log without its file is refused, kept."""
    path = tmp_path / "s.db"
    _killed_file(path)
    renamed = []
    rename = Path.rename

    def recorded(self, target):
        renamed.append(Path(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", recorded)
    Store.open(path, new_state=True).close()
    monkeypatch.undo()
    moved = renamed[0]
    assert len(renamed) == 1 and moved.name.startswith("s.db.replaced-")  # one rename: no window left
    alone = Store.open(moved)
    assert sorted(alone.load()["jobs"]) == ["a0", "a1", "a2"]
    alone.close()
    # the other order of events: a log whose file is gone is refused, and left where it is
    other = tmp_path / "other"
    other.mkdir()
    _killed_file(other / "s.db")
    (other / "s.db").rename(other / "s.db.moved")
    log = (other / "s.db-wal").read_bytes()
    with pytest.raises(StateDamaged, match="missing, but its write-ahead log s.db-wal is there"):
        Store.open(other / "s.db")
    assert (other / "s.db-wal").read_bytes() == log and not (other / "s.db").exists()


def test_a_commit_that_fails_on_any_error_rolls_back_and_the_next_one_runs(tmp_path):
    """An int over SQLite's 64 bits raised OverflowError, which skipped the ROLLBACK: the
    transaction stayed open and every later commit failed ("cannot start a transaction
    within a transaction") until a restart."""
    path, store = _committed_file(tmp_path, close=False)
    rows = store.dump()
    cp = ControlPlane.restore(store.load())
    cp.submit(_job("b"), 2.0, hash_token("b"))
    changes = cp.take_changes()
    changes.jobs["b"] = (2**63, changes.jobs["b"][1])
    with pytest.raises(CommitFailed, match="OverflowError"):
        store.commit(changes)
    assert store.dump() == rows
    changes.jobs["b"] = (5, changes.jobs["b"][1])
    store.commit(changes)
    assert "b" in store.load()["jobs"]
    store.close()


@pytest.mark.parametrize("table, key, body, needle", [
    ("jobs", "a", "{not json", "jobs row 'a' is not as a commit writes it"),
    ("jobs", "a", '{"x": NaN}', "NaN is not a number a commit writes"),
    ("meta", "globals", "[" * 200_000 + "]" * 200_000, "meta 'globals' is not as a commit writes it"),
])
def test_a_body_a_commit_never_writes_is_refused_naming_its_row(tmp_path, table, key, body, needle):
    path, _ = _committed_file(tmp_path)
    db = sqlite3.connect(path)
    column = "job_id" if table == "jobs" else "key"
    db.execute(f"UPDATE {table} SET {'body' if table == 'jobs' else 'value'} = ? WHERE {column} = ?", (body, key))
    db.commit()
    db.close()
    store = Store.open(path)
    with pytest.raises(StateDamaged, match=needle):
        store.load()
    store.close()


def test_a_schema_version_no_migration_reads_is_refused(tmp_path):
    path, _ = _committed_file(tmp_path)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")  # (it was a KeyError traceback)
    db.commit()
    db.close()
    with pytest.raises(StateDamaged, match="schema version 1 is not one this rollmux reads"):
        Store.open(path)


def test_the_event_log_keeps_the_latest_events_it_is_told_to(tmp_path):
    """Every grant is an event: without a bound the file grew with every phase of every
    job. With ``keep_events`` the oldest go in the commit that adds new ones; the kept
    ones keep their sequence numbers."""
    store = Store.open(tmp_path / "s.db", keep_events=4)
    cp = ControlPlane(_cluster())
    store.commit(cp.take_changes())
    for i in range(6):
        cp.submit(_job(f"j{i}", iterations=None), float(i), hash_token(f"t{i}"))
        store.commit(cp.take_changes())
    seqs = [e["seq"] for e in store.events(0)]
    assert len(seqs) == 4 and seqs == list(range(cp.last_seq - 3, cp.last_seq + 1))
    assert store.last_event_seq() == cp.last_seq and cp.last_seq > 4
    store.close()
    whole = Store.open(tmp_path / "whole.db")  # no bound: every event stays
    cp = ControlPlane(_cluster())
    for i in range(6):
        cp.submit(_job(f"j{i}", iterations=None), float(i), hash_token(f"t{i}"))
        whole.commit(cp.take_changes())
    assert [e["seq"] for e in whole.events(0)] == list(range(1, cp.last_seq + 1))
    whole.close()

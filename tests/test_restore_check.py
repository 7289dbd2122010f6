"""A state that contradicts itself is refused at restore, naming the contradiction
(``rollmux.runtime.restore_check``); the service refuses to start on it and the file
keeps its rows. Each case below was served before: one node granted to two groups, a
job in two groups, 500s on every change touching a bad row."""
from __future__ import annotations

import copy
import json
import math
import sqlite3

import pytest

from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.control import ControlPlane
from rollmux.runtime.restore_check import StateInconsistent
from rollmux.runtime.service import Service, ServiceConfig
from rollmux.runtime.store import CommitFailed, StateDamaged, Store, hash_token

ADMIN = "restore-check-admin-" + "x" * 12


def _plane() -> ControlPlane:
    """Two groups on a bounded cluster (j0, j1 alone at SLO 1.0), one waiting job (j2),
    free nodes left, grants out."""
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=3), train=PoolSpec("H800", 5.28, nodes=3),
                      switch_cost=SwitchCost("fixed"), max_group_size=1)
    cp = ControlPlane(cluster)
    for i in range(3):
        cp.submit(Job(f"j{i}", 10.0, 10.0, slo=1.0, iterations=4, rollout_gpus=16 if i == 2 else 8), float(i),
                  hash_token(f"t{i}"))
    cp.acquire("j0", "rollout")
    return cp


def _snap() -> dict:
    return json.loads(json.dumps(_plane().snapshot()))


def _groups(snap: dict) -> list[str]:
    return sorted(snap["groups"])


def _free_node_held(s):
    s["globals"]["inventory"]["free"]["rollout"] = list(s["groups"][_groups(s)[0]]["rollout_nodes"])


def _job_in_two_groups(s):
    a, b = _groups(s)
    s["groups"][b]["members"].append(s["groups"][a]["members"][0])


def _unknown_state(s):
    s["jobs"]["j0"]["state"] = "zombie"


def _group_row_lost(s):
    del s["groups"][_groups(s)[1]]


def _stray_row(s):
    s["jobs"]["zz"] = copy.deepcopy(s["jobs"]["j0"])


def _negative_gpus(s):
    s["jobs"]["j1"]["job"]["rollout_gpus"] = -8


def _zero_phases(s):
    s["jobs"]["j1"]["job"]["t_roll_s"] = s["jobs"]["j1"]["job"]["t_train_s"] = 0.0


def _waiting_lists_a_placed_job(s):
    s["globals"]["waiting"].append("j0")


def _waiting_lists_nobody(s):
    s["globals"]["waiting"].append("nobody")


def _node_in_two_groups(s):
    a, b = _groups(s)
    s["groups"][b]["train_nodes"] = list(s["groups"][a]["train_nodes"])


def _cluster_shrunk(s):  # saved with three rollout nodes, the cluster row now lists one
    s["cluster"]["rollout"]["nodes"] = 1
    s["globals"]["inventory"]["free"]["rollout"] = []


def _free_node_of_the_other_pool(s):
    free = s["globals"]["inventory"]["free"]
    free["rollout"], free["train"] = list(free["train"]), []


def _negative_seq(s):
    s["globals"]["seq"] = -5


def _huge_ord(s):
    s["globals"]["ord"] = 2**63


def _nan_clock(s):
    s["globals"]["clock"] = math.nan


@pytest.mark.parametrize("damage, needle", [
    (_free_node_held, "is listed free and held by group"),
    (_job_in_two_groups, "is a member of groups"),
    (_unknown_state, "state 'zombie'"),
    (_group_row_lost, "which does not list it"),
    (_stray_row, "jobs row 'zz' holds job 'j0'"),
    (_negative_gpus, "rollout_gpus"),
    (_zero_phases, "t_roll_s"),
    (_waiting_lists_a_placed_job, "lists 'j0' which is not a waiting job"),
    (_waiting_lists_nobody, "lists 'nobody'"),
    (_node_in_two_groups, "is held by groups"),
    (_cluster_shrunk, "names node 'R1' of the rollout pool, which the saved cluster does not have"),
    (_free_node_of_the_other_pool, "the free list names node 'T2' of the rollout pool"),
    (_negative_seq, "globals.seq=-5"),
    (_huge_ord, "globals.ord="),
    (_nan_clock, "globals.clock=nan"),
])
def test_a_state_that_contradicts_itself_is_refused_naming_it(damage, needle):
    snap = _snap()
    ControlPlane.restore(copy.deepcopy(snap))  # the state as written restores
    damage(snap)
    with pytest.raises(StateInconsistent, match=needle):
        ControlPlane.restore(snap)


def test_a_departed_record_that_is_not_ended_is_refused():
    snap = _snap()
    gone = copy.deepcopy(snap["jobs"]["j2"])  # a waiting job's record among the departed
    gone["job"]["job_id"] = "gone"
    with pytest.raises(StateInconsistent, match="departed record of job 'gone' is waiting"):
        ControlPlane.restore(snap, ended=[gone])


def _file(tmp_path, damage=None) -> str:
    """A state file of ``_plane`` as a service would have written it, then damaged by
    editing its rows with ``damage(snapshot)``."""
    path = str(tmp_path / "state.db")
    cp = _plane()
    store = Store.open(path)
    store.commit(cp.take_changes())
    store.close()
    if damage is not None:
        snap = _snap()
        damage(snap)
        db = sqlite3.connect(path)
        db.execute("UPDATE meta SET value = ? WHERE key = 'globals'", (json.dumps(snap["globals"]),))
        db.execute("DELETE FROM jobs")
        db.executemany("INSERT INTO jobs (job_id, ord, body) VALUES (?, ?, ?)",
                       [(k, b["ord"], json.dumps(b)) for k, b in snap["jobs"].items()])
        db.execute("DELETE FROM groups")
        db.executemany("INSERT INTO groups (group_id, ord, body) VALUES (?, ?, ?)",
                       [(k, b["ord"], json.dumps(b)) for k, b in snap["groups"].items()])
        db.commit()
        db.close()
    return path


def _rows(path: str) -> str:
    store = Store.open(path)
    try:
        return store.dump()
    finally:
        store.close()


@pytest.mark.parametrize("damage, needle", [
    (_free_node_held, "is listed free and held by group"),
    (_negative_seq, "globals.seq=-5"),
    (lambda s: s["globals"].update(seq=1), "globals.seq=1 is below the event log's last seq"),
])
def test_the_service_refuses_to_start_on_such_a_file_and_keeps_its_rows(tmp_path, damage, needle):
    path = _file(tmp_path, damage)
    rows = _rows(path)
    with pytest.raises(StateDamaged, match=needle):
        Service(None, path, ADMIN, ServiceConfig())
    assert _rows(path) == rows
    (tmp_path / "sound").mkdir()
    service = Service(None, _file(tmp_path / "sound"), ADMIN, ServiceConfig())  # the file as written starts
    assert sorted(service.control.jobs) == ["j0", "j1", "j2"]
    service.store.close()


def test_a_change_whose_commit_fails_is_undone_and_the_next_change_commits(tmp_path):
    """A commit that raised anything but an SQLite, value or OS error left its
    transaction open: the change stayed in memory (a job served as placed that the file
    never had) and every later change failed until a restart."""
    service = Service(None, _file(tmp_path), ADMIN, ServiceConfig())
    try:
        service.control._ord = 2**63  # SQLite's integers stop at 2**63 - 1: the commit fails

        def submit(name):
            return lambda c, now: c.submit(Job(name, 10.0, 10.0, slo=1.0, iterations=2), now, hash_token(name))

        with pytest.raises(CommitFailed, match="OverflowError"):
            service._apply([submit("late")])
        assert "late" not in service.control.jobs  # memory went back to the file
        outcomes, _ = service._apply([submit("next")])
        assert outcomes[0][1] is None and "next" in service.control.jobs
        assert "next" in service.store.load()["jobs"]
    finally:
        service.store.close()

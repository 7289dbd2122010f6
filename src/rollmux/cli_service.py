"""Service commands of ``rollmux``: serve, status, submit, cancel, jobs, admin.

``register(app)`` adds them to the main Typer app. The client commands talk to the
service at ``--url`` (or $ROLLMUX_URL) with a credential from $ROLLMUX_TOKEN, else
$ROLLMUX_ADMIN_TOKEN, else ``--token-file`` (never a command-line value, which other
users could read in the process list).
"""
from __future__ import annotations

import contextlib
import json
import os
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape
from rich.table import Table

from rollmux.cli_choices import QUEUE_HELP, REGROUP_HELP, QueueOrder, RegroupDecisions
from rollmux.cli_output import console, error_console
from rollmux.cli_output import fail as _fail
from rollmux.errors import RollMuxError
from rollmux.model import POOLS

DEFAULT_URL = "http://127.0.0.1:8470"
DAY_S = 86_400.0  # the most any of serve's durations may be: a finite bound (inf would never expire)
URL_OPT = typer.Option(DEFAULT_URL, "--url", envvar="ROLLMUX_URL", help="Control plane address.")
TOKEN_FILE_OPT = typer.Option(None, "--token-file",
                              help="File holding the admin or tenant token (else $ROLLMUX_TOKEN or "
                                   "$ROLLMUX_ADMIN_TOKEN).")

jobs_app = typer.Typer(no_args_is_help=True, help="List and inspect jobs (admin token).")
admin_app = typer.Typer(no_args_is_help=True, help="Operate the control plane: nodes, backups, tenants.")
nodes_app = typer.Typer(no_args_is_help=True, help="Add, drain and undrain nodes of bounded pools (admin token).")
admin_app.add_typer(nodes_app, name="nodes")


class JobState(str, Enum):
    waiting = "waiting"
    placed = "placed"
    done = "done"
    cancelled = "cancelled"
    expired = "expired"


class LivePolicy(str, Enum):
    rollmux = "rollmux"
    rollmux_consolidate = "rollmux-consolidate"
    rollmux_regroup = "rollmux-regroup"
    rollmux_full = "rollmux-full"
    rollmux_full_regroup = "rollmux-full-regroup"
    rollmux_host = "rollmux-host"
    rollmux_host_regroup = "rollmux-host-regroup"
    rollmux_lifetime = "rollmux-lifetime"
    rollmux_full_lifetime = "rollmux-full-lifetime"
    rollmux_hedge = "rollmux-hedge"


class PoolName(str, Enum):
    rollout = "rollout"
    train = "train"


def _credential(token_file: Optional[Path]) -> Optional[str]:
    if token_file is not None:
        try:
            token, where = token_file.read_text(encoding="utf-8").strip() or None, f"--token-file {token_file}"
        except (OSError, UnicodeDecodeError) as err:
            _fail(RollMuxError(f"--token-file: {err}"))
    else:
        name = "ROLLMUX_TOKEN" if os.environ.get("ROLLMUX_TOKEN") else "ROLLMUX_ADMIN_TOKEN"
        token, where = os.environ.get(name) or None, f"${name}"
    from rollmux.runtime.sdk import TOKEN_PATTERN

    if token is not None and not TOKEN_PATTERN.fullmatch(token):  # (never printed)
        _fail(RollMuxError(f"{where}: not a token (one word of printable ASCII, no spaces or line breaks)"))
    return token


def _client(url: str, token_file: Optional[Path]):
    from rollmux.runtime.sdk import Client

    token = _credential(token_file)
    try:
        return Client(url, token, give_up_s=5.0)
    except ValueError:  # (the SDK's check of the url: the only argument given here that it can refuse)
        _fail(RollMuxError(f"--url {url!r} (or $ROLLMUX_URL): expected http://HOST:PORT or https://HOST:PORT"))


def _ask(url: str, token_file: Optional[Path], call: Callable[[Any], Any]) -> Any:
    """``call(client)``; a refusal, an argument the service could never take (a job id or
    node name that is not one) or an unreachable service is printed and exits 2."""
    from rollmux.runtime.sdk import ClientError

    try:
        return call(_client(url, token_file))
    except (ClientError, ValueError, TypeError) as err:
        _fail(err)


@contextlib.contextmanager
def _reading(url: str, what: str):
    """Show the service's ``what``: an answer without the fields shown, or with a field of
    another kind (not RollMux's API, e.g. another service at ``url``), exits 2 naming the url."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        _fail(RollMuxError(f"{url}: the {what} it answered is not RollMux's ({type(err).__name__}: {err}); is "
                           f"--url (or $ROLLMUX_URL) the control plane's address?"))


def serve(
    cluster: Optional[Path] = typer.Option(None, "--cluster",
                                           help="Cluster YAML, or a fleet YAML of several GPU types (a `pools` "
                                                "list, docs/fleet.md: each job's pair of types is chosen too). "
                                                "First start: default is the paper's testbed. On a restart a "
                                                "cluster file is reconciled with the saved cluster (added nodes "
                                                "join, free removed nodes leave, prices apply from now on), a fleet "
                                                "file must equal the saved fleet; without it the saved one is kept."),
    profiles: Optional[Path] = typer.Option(None, "--profiles",
                                            help="With a fleet file: measured phase seconds per GPU type, CSV "
                                                 "job_id,gpu,t_roll_s,t_train_s (else the trace's columns and the "
                                                 "roofline rule, docs/fleet.md)."),
    state: Path = typer.Option(Path("rollmux-state.db"), "--state",
                               help="SQLite state file (created if missing, locked while served)."),
    new_state: bool = typer.Option(False, "--new-state",
                                   help="Move an existing state file aside and start empty."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8470, "--port", min=1, max=65535),
    admin_token_file: Optional[Path] = typer.Option(
        None, "--admin-token-file",
        help="File with the admin token ($ROLLMUX_ADMIN_TOKEN wins); created with a new token (0600) if missing. "
             "Default: STATE.admin-token."),
    tenants: Optional[Path] = typer.Option(None, "--tenants",
                                           help="YAML {tenants: {NAME: {token_sha256: HEX, max_live_jobs: N, "
                                                "max_gpus: N}}}: who may submit besides the admin (see `rollmux "
                                                "admin tenant-token`), and, optionally, how many live jobs and "
                                                "GPUs (rollout + training) each tenant's jobs may hold at once."),
    lease_s: float = typer.Option(30.0, "--lease-s", min=0.1, max=DAY_S,
                                  help="Seconds a job may go without a call before it loses its nodes (plus "
                                       "--grace-s)."),
    grace_s: float = typer.Option(10.0, "--grace-s", min=0.0, max=DAY_S,
                                  help="Extra seconds tolerated on top of the lease for slow networks."),
    max_job_gpus: int = typer.Option(256, "--max-job-gpus", min=1,
                                     help="Most GPUs one job may ask of an unbounded pool."),
    max_live_jobs: int = typer.Option(5000, "--max-live-jobs", min=1, help="Most live jobs at once."),
    keep_ended: int = typer.Option(10_000, "--keep-ended", min=0,
                                   help="Departed jobs kept in memory, in /v1/status and in job lists (the latest "
                                        "ones); every departed record stays in the state file, and GET "
                                        "/v1/jobs/ID still answers for an older one."),
    keep_events: int = typer.Option(1_000_000, "--keep-events", min=1_000,
                                    help="Events kept in the state file's log (/v1/events): the latest ones; "
                                         "older ones are deleted as new ones come (a grant is one event: "
                                         "without a bound the file grows with every phase)."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert",
                                            help="PEM certificate (chain) to serve https with (with --tls-key). "
                                                 "Clients trust it by $ROLLMUX_CA_FILE (the SDK's ca_file)."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="PEM private key of --tls-cert."),
    body_timeout_s: float = typer.Option(10.0, "--body-timeout-s", min=0.1, max=3600.0,
                                         help="A request body not received whole within this many seconds is "
                                              "answered 408 and its connection closed (slow or stalled clients)."),
    header_timeout_s: float = typer.Option(10.0, "--header-timeout-s", min=0.1, max=3600.0,
                                           help="A connection whose next request's headers are not in whole within "
                                                "this many seconds (of connecting, or of its last answer) is closed, "
                                                "with a 408 if part of a request came (slow or idle clients)."),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="JSON-lines log (default: stderr)."),
    policy: LivePolicy = typer.Option(LivePolicy.rollmux, "--policy",
                                      help="rollmux (Algorithm 1), rollmux-consolidate (also moves running jobs "
                                           "into other groups when that frees nodes), rollmux-regroup (also "
                                           "re-solves two groups after a departure and moves their jobs), "
                                           "rollmux-full (Algorithm 1 with training scaling and co-location) or "
                                           "rollmux-full-regroup (the full space, regrouping after departures and "
                                           "after arrivals that open a group), rollmux-host (Algorithm 1, and a job "
                                           "may run both phases on a group's training nodes) or "
                                           "rollmux-host-regroup (with regrouping), rollmux-lifetime or "
                                           "rollmux-full-lifetime (each arrival placed by the dollars it adds "
                                           "until its group ends, from the iterations each job has left), "
                                           "rollmux-hedge (no group dearer than its jobs alone on their cheapest "
                                           "options; jobs alone gathered; planned as a fleet of one pair of types), "
                                           "decision for decision as "
                                           "`rollmux simulate` does. On a fleet: rollmux, rollmux-full, "
                                           "rollmux-lifetime, rollmux-full-lifetime, rollmux-regroup or "
                                           "rollmux-full-regroup (regrouping within a pair of GPU types, or a "
                                           "job left alone moved to another pair) or rollmux-hedge, as `rollmux "
                                           "fleet simulate` does."),
    migration_s: float = typer.Option(300.0, "--migration-s", min=0.0, max=DAY_S,
                                      help="Pause a move is planned with until moves of that model size are "
                                           "measured."),
    move_timeout_s: float = typer.Option(600.0, "--move-timeout-s", min=1.0, max=DAY_S,
                                         help="A move the job has not acknowledged by then is undone."),
    queue: QueueOrder = typer.Option("backfill", help=QUEUE_HELP),
    regroup_decisions: RegroupDecisions = typer.Option("apart", "--regroup-decisions", help=REGROUP_HELP),
) -> None:
    """Run the control plane (HTTP+JSON under /v1, OpenAPI at /docs). A state file that exists is resumed."""
    from rollmux.fleet import Fleet, load_profiles
    from rollmux.fleet_file import load_cluster_or_fleet
    from rollmux.runtime import auth, logs
    from rollmux.runtime.control import ControlError, check_live_policy
    from rollmux.runtime.service import ServiceConfig, check_tls, listen, run

    try:
        cert, key = (str(tls_cert) if tls_cert else None), (str(tls_key) if tls_key else None)
        check_tls(cert, key)  # before any state file is written
        spec = load_cluster_or_fleet(cluster) if cluster is not None else None
        if profiles is not None and not isinstance(spec, Fleet):
            raise RollMuxError("--profiles: per-type phase profiles need --cluster naming a fleet file (with `pools`)")
        try:  # before any state file is written
            check_live_policy(policy.value, isinstance(spec, Fleet))
        except ControlError as err:
            raise RollMuxError(f"--policy {err.reason}") from None
        measured = load_profiles(profiles, spec) if profiles is not None else None
        known = auth.load_tenants(tenants)
        _check_state_path(state, new_state)  # before the admin token is written beside it
        try:  # the last check: a taken port leaves no state file, lock or admin token behind
            sockets = listen(host, port)
        except OSError as err:
            raise RollMuxError(f"--host {host} --port {port}: {err.strerror or err}") from None
        token, source = auth.admin_token(admin_token_file, state)
        config = ServiceConfig(lease_s=lease_s, grace_s=grace_s, max_job_gpus=max_job_gpus,
                               max_live_jobs=max_live_jobs, keep_ended=keep_ended, keep_events=keep_events,
                               body_timeout_s=body_timeout_s,
                               header_timeout_s=header_timeout_s,
                               tenants=known.hashes, quotas=known.quotas,
                               policy=policy.value, migration_s=migration_s, move_timeout_s=move_timeout_s,
                               backfill=queue.value == "backfill",
                               decide_apart=regroup_decisions.value == "apart")
        logs.setup(log_file).info("admin_token", extra={"source": source})
        if log_file is not None:  # (else that line is on stderr already)
            typer.echo(f"rollmux: admin token from {source}", err=True)
        run(spec, str(state), token, config, host, port, new_state, measured, cert, key, sockets)
    except (RollMuxError, OSError) as err:
        _fail(err)


def _check_state_path(state: Path, new_state: bool) -> None:
    """A ``--state`` that cannot be a state file, refused naming the option before anything
    is written (the admin token file beside it, the lock): a folder, a path under a missing
    folder or under a file, or (unless ``--new-state`` moves it aside) a file that is not an
    SQLite database."""
    from rollmux.runtime.store import StateDamaged, check_header

    if state.is_dir():
        raise RollMuxError(f"--state {state}: a directory; give the state file's path (e.g. {state / 'state.db'})")
    parent = state.parent
    if not parent.exists():
        raise RollMuxError(f"--state {state}: the folder {parent} does not exist; create it first")
    if not parent.is_dir():
        raise RollMuxError(f"--state {state}: {parent} is not a folder")
    if state.exists() and not new_state:
        try:
            check_header(state)
        except StateDamaged as err:
            raise RollMuxError(f"--state {err}") from None


def status(url: str = URL_OPT, token_file: Optional[Path] = TOKEN_FILE_OPT,
           as_json: bool = typer.Option(False, "--json", help="Print the raw status document.")) -> None:
    """Groups, pinning, who holds which node, queue order, measured slowdown vs SLO (admin)."""
    doc = _ask(url, token_file, lambda c: c.status())
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    with _reading(url, "status"):
        _print_status(doc)


def _print_status(doc: dict) -> None:
    """The status document as tables and lines (a ``KeyError`` or ``TypeError`` on another shape)."""
    groups = _table("groups", ("group", "rollout nodes", "train nodes", "members (pinning)", "holders", "queues",
                               "$/h"))
    for g in doc["groups"]:
        pins = "\n".join(f"{m['job_id']}: R[{','.join(m['rollout_nodes'])}] T[{','.join(m['train_nodes'])}]"
                         for m in g["members"])
        holders = "\n".join(f"{n} <- {j}" for n, j in sorted(g["holders"].items())) or "-"
        queues = "\n".join(f"{p}: {' > '.join(q) or '-'}" for p, q in g["queues"].items())
        groups.add_row(*(escape(x) for x in (g["group_id"], ",".join(g["rollout_nodes"]), ",".join(g["train_nodes"]),
                                             pins, holders, queues)), f"{g['cost_per_hour']:.2f}")
    console.print(groups)
    console.print(_jobs_table(doc["jobs"]))
    if doc.get("tenants"):
        tenants = _table("tenants", ("tenant", "live jobs", "GPUs asked"))
        bound = lambda used, most: f"{used}" if most is None else f"{used} / {most}"  # noqa: E731
        for name, t in doc["tenants"].items():
            tenants.add_row(escape(name), bound(t["live_jobs"], t["max_live_jobs"]), bound(t["gpus"], t["max_gpus"]))
        console.print(tenants)
    for r in doc.get("regroupings", []):
        state = f"opened as {r['opened']}" if r["opened"] else f"stopping {', '.join(r['waiting']) or '-'}"
        console.print(escape(f"regrouping {r['regroup']}: {', '.join(r['members'])} ({state})"))
    for o in doc.get("overdue", []):  # a phase that does not end: a hung worker holds its nodes
        console.print("[yellow]" + escape(f"overdue: {o['job_id']} has held its {o['pool']} phase on "
                                          f"{','.join(o['nodes'])} for {o['held_s']:,.0f} s (profile allows "
                                          f"{o['allowed_s']:,.0f} s); `rollmux cancel {o['job_id']}` frees "
                                          f"the nodes") + "[/yellow]")
    console.print(f"waiting ({escape(doc.get('queue', 'fifo'))}): {escape(', '.join(doc['waiting']) or '-')}   "
                  f"drained: {escape(', '.join(doc['drained']) or '-')}   "
                  f"held for regroupings: {escape(', '.join(doc.get('held', [])) or '-')}   "
                  f"cost: ${doc['cost_per_hour']:.2f}/h")


def _vs_profile(job: dict) -> str:
    """Longest released phase per pool against the profile, e.g. "12.0/31.5 vs 10.0/30.0 (3 over)"."""
    if "profile_s" not in job:
        return "-"
    got, spec = job["measured_max_s"], job["profile_s"]
    text = (f"{'/'.join('-' if p not in got else f'{got[p]:.1f}' for p in POOLS)} vs "
            f"{'/'.join(f'{spec[p]:.1f}' for p in POOLS)}")
    return text + (f" ({job['over_profile']} over)" if job["over_profile"] else "")


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A table whose cells wrap and are never cut short: a job id is what ``cancel`` takes."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def _jobs_table(jobs: list[dict]) -> Table:
    table = _table("jobs", ("job", "state", "tenant", "group", "iterations", "progress", "slowdown", "SLO",
                            "R/T max s vs profile", "grant"))
    for j in jobs:
        slow = "-" if j.get("measured_slowdown") is None else f"{j['measured_slowdown']:.2f}"
        its = f"{j['iterations_done']}/{j['iterations'] or '-'}"
        held = j.get("grants") or ([j["grant"]] if j["grant"] else [])  # an asynchronous job may hold both pools
        grant = "; ".join(f"{g['pool']} on {','.join(g['nodes'])}" for g in held) or "-"
        group = j.get("group_id") or (j.get("placement") or {}).get("group_id") or "-"
        slo = f"{j['slo']:.2f}" if "slo" in j else "-"
        table.add_row(*(escape(str(x)) for x in (j["job_id"], j["state"], j.get("tenant", ""), group, its,
                                                  f"{j['progress']:.0%}", slow, slo, _vs_profile(j), grant)))
    return table


def submit(job_file: Path = typer.Argument(..., help="YAML mapping of the job's trace columns."),
           url: str = URL_OPT, token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """Register a job (admin or tenant token); prints its token and placement. The job's
    process must attach and heartbeat within the lease, or the job expires."""
    from rollmux.cluster_file import read_mapping
    from rollmux.runtime.sdk import ClientError

    try:
        spec = read_mapping(job_file, "job")  # (errors name the file and line)
        if not spec:
            raise RollMuxError(f"{job_file}: the job file is empty; expected a mapping of trace columns "
                               f"(job_id: ..., t_roll_s: ..., ...)")
        job = _client(url, token_file).submit(spec, heartbeat=False)
    except (ClientError, RollMuxError, OSError, ValueError, TypeError) as err:
        _fail(err)
    view = job.view
    with _reading(url, "job"):
        # one line, never wrapped: scripts read the token from it (the service keeps only its hash)
        typer.echo(f"job {job.job_id}: {view['outcome']}, token {job.token}")
        if job.placement:
            p = job.placement
            console.print(escape(f"group {p['group_id']}: R[{','.join(p['rollout_nodes'])}] "
                                 f"T[{','.join(p['train_nodes'])}]"))
        for line in view["explanation"]:
            console.print(f"  {escape(line)}")


def cancel(job_id: str = typer.Argument(...), url: str = URL_OPT, token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """Cancel a job (admin): it leaves its group and its nodes go back."""
    view = _ask(url, token_file, lambda c: c.cancel(job_id))
    with _reading(url, "job"):
        console.print(escape(f"job {job_id}: {view['state']} ({view['reason']})"))


@jobs_app.command("list")
def jobs_list(state: Optional[JobState] = typer.Option(None, "--state", help="Only jobs in this state."),
              group: Optional[str] = typer.Option(None, "--group", help="Only jobs of this group."),
              tenant: Optional[str] = typer.Option(None, "--tenant", help="Only jobs of this tenant."),
              limit: int = typer.Option(1000, "--limit", min=1, max=10000, help="At most this many jobs."),
              offset: int = typer.Option(0, "--offset", min=0, help="Skip this many matching jobs first (the "
                                                                    "next page: --offset 1000)."),
              as_json: bool = typer.Option(False, "--json"),
              url: str = URL_OPT, token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """Jobs in submission order (departed ones first), filtered; a page of at most --limit."""
    jobs = _ask(url, token_file, lambda c: c.jobs(state.value if state else None, group, tenant, limit, offset))
    if as_json:
        print(json.dumps(jobs, indent=2))
    else:
        with _reading(url, "job list"):
            console.print(_jobs_table(jobs))
        if len(jobs) == limit:  # (stderr: a table redirected to a file holds only itself)
            error_console.print(f"[yellow]{limit} jobs shown, the --limit: more may match; the next page is "
                                f"--offset {offset + limit}, or narrow with --state, --group or --tenant[/yellow]")


@jobs_app.command("show")
def jobs_show(job_id: str = typer.Argument(...), url: str = URL_OPT,
              token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """One job: state, placement, grant, progress and the planner's explanation (JSON)."""
    print(json.dumps(_ask(url, token_file, lambda c: c.job(job_id)), indent=2))


@nodes_app.command("add")
def nodes_add(pool: PoolName = typer.Argument(..., help="rollout or train."),
              node_id: str = typer.Argument("", help="The new node's id (a pool that lists its nodes needs one)."),
              host_mem_gb: Optional[float] = typer.Option(None, "--host-mem-gb", min=0.001, max=1e6),
              url: str = URL_OPT, token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """Add a node to a bounded pool, live; waiting jobs may be placed on it at once."""
    out = _ask(url, token_file, lambda c: c.add_node(pool.value, node_id, host_mem_gb))
    with _reading(url, "node"):
        console.print(escape(f"added {out['node']} to {pool.value}; placed: {', '.join(out['placed']) or '-'}"))


@nodes_app.command("drain")
def nodes_drain(node: str = typer.Argument(...), url: str = URL_OPT,
                token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """No new job is pinned to NODE; jobs on it finish there, then it is withheld."""
    out = _ask(url, token_file, lambda c: c.drain(node))
    with _reading(url, "node"):
        console.print(escape(f"drained {out['node']}; jobs still on it: {', '.join(out['jobs_on_node']) or '-'}"))


@nodes_app.command("undrain")
def nodes_undrain(node: str = typer.Argument(...), url: str = URL_OPT,
                  token_file: Optional[Path] = TOKEN_FILE_OPT) -> None:
    """Put a drained node back in service."""
    out = _ask(url, token_file, lambda c: c.undrain(node))
    with _reading(url, "node"):
        console.print(escape(f"undrained {out['node']}; placed: {', '.join(out['placed']) or '-'}"))


@admin_app.command("backup")
def admin_backup(out: Path = typer.Argument(..., help="New file to write the backup to."),
                 state: Path = typer.Option(Path("rollmux-state.db"), "--state", help="The service's state file.")) -> None:
    """Consistent copy of the state file, also while the service runs (SQLite online backup)."""
    import sqlite3

    from rollmux.runtime.store import StoreError, backup_file

    try:
        backup_file(state, out)
    except (StoreError, OSError, sqlite3.Error) as err:
        _fail(err)
    console.print(escape(f"backed up {state} to {out} ({out.stat().st_size} bytes, integrity ok)"))


@admin_app.command("restore")
def admin_restore(backup: Path = typer.Argument(..., help="A file written by `rollmux admin backup`."),
                  state: Path = typer.Option(Path("rollmux-state.db"), "--state",
                                             help="The state file to replace (the service must be stopped).")) -> None:
    """Put a backup in place of the state file; the old file is kept beside it."""
    import sqlite3

    from rollmux.runtime.store import StoreError, restore_file

    try:
        moved = restore_file(backup, state)
    except (StoreError, OSError, sqlite3.Error) as err:
        _fail(err)
    console.print(escape(f"restored {backup} to {state}" + (f"; the old file is now {moved}" if moved else "")))


@admin_app.command("tenant-token")
def admin_tenant_token(name: str = typer.Argument(..., help="Tenant name (letters, digits, '.', '_', '-')."),
                       max_live_jobs: Optional[int] = typer.Option(None, "--max-live-jobs", min=1,
                                                                   help="Quota: most live jobs of the tenant."),
                       max_gpus: Optional[int] = typer.Option(None, "--max-gpus", min=1,
                                                              help="Quota: most GPUs (rollout + training) its live "
                                                                   "jobs may ask for.")) -> None:
    """Make a submit token for a tenant: prints the token (give it to the tenant) and the
    line for the --tenants file (only the hash is stored), with its quota when given."""
    from rollmux.runtime.auth import TENANT_PATTERN, new_token
    from rollmux.runtime.store import hash_token

    if not TENANT_PATTERN.fullmatch(name) or name == "admin":  # (match took "ok\n": $ allows a final newline)
        _fail(RollMuxError(f"NAME: {name!r} is not a tenant name (letters, digits, '.', '_', '-'; not 'admin')"))
    token = new_token()
    quota = "".join(f", {key}: {value}" for key, value in (("max_live_jobs", max_live_jobs), ("max_gpus", max_gpus))
                    if value is not None)
    typer.echo(f"token: {token}")
    # the name quoted: a YAML reader takes 010, 1.5 or null unquoted for a number or nothing
    typer.echo(f"tenants file entry:\n  \"{name}\": {{token_sha256: {hash_token(token)}{quota}}}")


def register(app: typer.Typer) -> None:
    """Add serve, status, submit, cancel, jobs and admin to ``app``."""
    app.command()(serve)
    app.command()(status)
    app.command()(submit)
    app.command()(cancel)
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(admin_app, name="admin")

"""Service commands of ``rollmux``: serve, status, submit, cancel.

``register(app)`` adds them to the main Typer app. The client commands talk to the
service at ``--url`` (or $ROLLMUX_URL); ``status`` and ``cancel`` need the admin token
(``--admin-token`` or $ROLLMUX_ADMIN_TOKEN).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from rollmux.errors import RollMuxError

DEFAULT_URL = "http://127.0.0.1:8470"
URL_OPT = typer.Option(DEFAULT_URL, "--url", envvar="ROLLMUX_URL", help="Control plane address.")
TOKEN_OPT = typer.Option(None, "--admin-token", envvar="ROLLMUX_ADMIN_TOKEN", help="Admin token.")

console = Console()


def _fail(err: Exception) -> None:
    console.print(f"[red]error:[/red] {err}")
    raise typer.Exit(2)


def serve(
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="Cluster YAML; default: the paper's testbed."),
    state: Path = typer.Option(Path("rollmux-state.db"), "--state", help="SQLite state file (created if missing)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8470, "--port"),
    admin_token: Optional[str] = TOKEN_OPT,
    lease_s: float = typer.Option(30.0, "--lease-s", help="Seconds without a heartbeat before a job loses its nodes."),
) -> None:
    """Run the control plane (HTTP+JSON, OpenAPI at /docs). A state file that exists is resumed."""
    from rollmux.cluster_file import load_cluster
    from rollmux.runtime.service import run

    try:
        spec = load_cluster(cluster)
    except (RollMuxError, OSError) as err:
        _fail(err)
    run(spec, str(state), host, port, admin_token, lease_s)


def status(url: str = URL_OPT, admin_token: Optional[str] = TOKEN_OPT,
           as_json: bool = typer.Option(False, "--json", help="Print the raw status document.")) -> None:
    """Groups, pinning, who holds which node, queue order, measured slowdown vs SLO."""
    from rollmux.runtime.sdk import Client, ClientError

    try:
        doc = Client(url, admin_token, give_up_s=5.0).status()
    except ClientError as err:
        _fail(err)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    groups = Table(title="groups")
    for col in ("group", "rollout nodes", "train nodes", "members (pinning)", "holders", "queues", "$/h"):
        groups.add_column(col)
    for g in doc["groups"]:
        pins = "\n".join(f"{m['job_id']}: R[{','.join(m['rollout_nodes'])}] T[{','.join(m['train_nodes'])}]"
                         for m in g["members"])
        holders = "\n".join(f"{n} <- {j}" for n, j in sorted(g["holders"].items())) or "-"
        queues = "\n".join(f"{p}: {' > '.join(q) or '-'}" for p, q in g["queues"].items())
        groups.add_row(g["group_id"], ",".join(g["rollout_nodes"]), ",".join(g["train_nodes"]), pins, holders,
                       queues, f"{g['cost_per_hour']:.2f}")
    console.print(groups)
    jobs = Table(title="jobs")
    for col in ("job", "state", "group", "iterations", "progress", "slowdown", "SLO", "grant"):
        jobs.add_column(col)
    for j in doc["jobs"]:
        slow = "-" if j["measured_slowdown"] is None else f"{j['measured_slowdown']:.2f}"
        its = f"{j['iterations_done']}/{j['iterations'] or '-'}"
        grant = f"{j['grant']['pool']} on {','.join(j['grant']['nodes'])}" if j["grant"] else "-"
        jobs.add_row(j["job_id"], j["state"], j["group_id"] or "-", its, f"{j['progress']:.0%}", slow,
                     f"{j['slo']:.2f}", grant)
    console.print(jobs)
    console.print(f"waiting: {', '.join(doc['waiting']) or '-'}   drained: {', '.join(doc['drained']) or '-'}   "
                  f"cost: ${doc['cost_per_hour']:.2f}/h")


def submit(job_file: Path = typer.Argument(..., help="YAML mapping of the job's trace columns."),
           url: str = URL_OPT) -> None:
    """Register a job; prints its token and placement. The job's process must attach and
    heartbeat within the lease, or the job expires."""
    from rollmux.runtime.sdk import Client, ClientError

    try:
        spec = yaml.safe_load(job_file.read_text(encoding="utf-8"))
        job = Client(url, give_up_s=5.0).submit(spec, heartbeat=False)
    except (ClientError, OSError, yaml.YAMLError) as err:
        _fail(err)
    view = job.view
    console.print(f"job {job.job_id}: {view['outcome']}, token {job.token}")
    if job.placement:
        p = job.placement
        console.print(f"group {p['group_id']}: R[{','.join(p['rollout_nodes'])}] T[{','.join(p['train_nodes'])}]")
    for line in view["explanation"]:
        console.print(f"  {line}")


def cancel(job_id: str = typer.Argument(...), url: str = URL_OPT, admin_token: Optional[str] = TOKEN_OPT) -> None:
    """Cancel a job (admin): it leaves its group and its nodes go back."""
    from rollmux.runtime.sdk import Client, ClientError

    try:
        view = Client(url, admin_token, give_up_s=5.0).cancel(job_id)
    except ClientError as err:
        _fail(err)
    console.print(f"job {job_id}: {view['state']} ({view['reason']})")


def register(app: typer.Typer) -> None:
    """Add serve, status, submit and cancel to ``app``."""
    app.command()(serve)
    app.command()(status)
    app.command()(submit)
    app.command()(cancel)

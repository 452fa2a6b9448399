"""``yard ti …``: Tencent TI's ``tictl job`` commands, with tictl's own flags.

``yard ti job create test73 --cluster=cls-rgaisoe4 --region=ap-guangzhou
--command="python train.py --model resnet50" --runtime=tfplus-1.6.0-gpu --wcount=3
--workertype=0U0G2P`` builds a TI Job object and sends it to ``POST /ti/v1/jobs``.
``--command`` is one command line, split like a shell does (tictl's ``--command`` is a
string; the Job's ``command`` is a list); ``--args`` likewise, and may be repeated.
``--region`` is kept as the job's ``ti.region`` label.

Built by :func:`make_ti_app` and mounted by ``cli.make_app``; it uses the parent's
session (``ctx.obj``: the client factory and the consoles).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table
from rich.text import Text

from .client import Client, TrainyardError

ClusterOpt = Annotated[
    str, typer.Option("--cluster", help="TI cluster (the queue), e.g. cls-rgaisoe4")
]
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="job name (unique per cluster)")]


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[
    Output, typer.Option("--output", "-o", help="table for people, json (TI's view) for scripts")
]

# TI's view fields in the order tictl shows them.
VIEW_FIELDS = (
    "name",
    "cluster",
    "state",
    "message",
    "createTime",
    "startTime",
    "endTime",
    "runtimeVersion",
    "masterType",
    "workerType",
    "workerCount",
    "parameterServerType",
    "parameterServerCount",
    "packageDir",
    "command",
    "args",
    "region",
    "id",
)


def _split(values: list[str] | None, flag: str) -> list[str]:
    items: list[str] = []
    for value in values or ():
        try:
            items.extend(shlex.split(value))
        except ValueError as exc:
            raise typer.BadParameter(f"{value!r}: {exc}", param_hint=flag) from None
    return items


def job_payload(
    name: str,
    *,
    cluster: str,
    command: str,
    region: str | None = None,
    args: list[str] | None = None,
    runtime: str | None = None,
    wcount: int | None = None,
    workertype: str | None = None,
    pscount: int | None = None,
    pstype: str | None = None,
    mastertype: str | None = None,
    package_dir: list[str] | None = None,
) -> dict[str, Any]:
    """The TI Job object tictl's flags describe (flags not given are left out)."""
    payload: dict[str, Any] = {
        "name": name,
        "cluster": cluster,
        "command": _split([command], "--command"),
    }
    optional = {
        "region": region,
        "runtimeVersion": runtime,
        "workerCount": wcount,
        "workerType": workertype,
        "parameterServerCount": pscount,
        "parameterServerType": pstype,
        "masterType": mastertype,
    }
    payload.update({k: v for k, v in optional.items() if v is not None})
    if args:
        payload["args"] = _split(args, "--args")
    # tictl takes several paths in one flag, comma-separated; repeating it works too.
    dirs = [d.strip() for value in package_dir or () for d in value.split(",") if d.strip()]
    if dirs:
        payload["packageDir"] = dirs
    return payload


def _path(cluster: str, name: str) -> str:
    for value, what in ((cluster, "cluster"), (name, "name")):
        if not value or "/" in value or value in (".", ".."):
            raise TrainyardError(f"not a TI {what}: {value!r}")
    return f"/ti/v1/jobs/{quote(cluster, safe='')}/{quote(name, safe='')}"


class TiApi:
    """The TI routes of a Trainyard gateway, over the SDK client's session."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.client._request("POST", "/ti/v1/jobs", json=payload)

    def get(self, cluster: str, name: str) -> dict[str, Any]:
        return self.client._request("GET", _path(cluster, name))

    def list(self, cluster: str | None, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if cluster:
            params["cluster"] = cluster
        return self.client._request("GET", "/ti/v1/jobs", params=params)

    def delete(self, cluster: str, name: str) -> dict[str, Any]:
        return self.client._request("DELETE", _path(cluster, name))


@contextmanager
def _reported(session: Any) -> Iterator[None]:
    try:
        yield
    except TrainyardError as exc:
        session.error(str(exc))
        raise typer.Exit(1) from None


def _show(value: Any) -> Text:
    if value is None or value == "" or value == []:
        return Text("-")
    if isinstance(value, list | dict):
        return Text(json.dumps(value, ensure_ascii=False))
    return Text(str(value))


def _print_view(session: Any, view: dict[str, Any]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for key in VIEW_FIELDS:
        if key in view:
            grid.add_row(key, _show(view[key]))
    session.out.print(grid)


def _warn(session: Any, answer: dict[str, Any]) -> None:
    for warning in answer.get("warnings") or ():
        text = (
            f"{warning.get('path')}: {warning.get('message')}"
            if isinstance(warning, dict)
            else str(warning)
        )
        session.err.print(Text("warning: ", style="yellow") + Text(text))


def make_ti_app() -> typer.Typer:
    ti_app = typer.Typer(
        help="Tencent TI jobs, with tictl's commands and flags.", no_args_is_help=True
    )
    job_app = typer.Typer(help="Create, show, list and delete TI jobs.", no_args_is_help=True)
    ti_app.add_typer(job_app, name="job")

    @job_app.command("create")
    def create(
        ctx: typer.Context,
        name: NameArg,
        cluster: ClusterOpt,
        command: Annotated[str, typer.Option("--command", help="the command line to run")],
        region: Annotated[str | None, typer.Option("--region", help="e.g. ap-guangzhou")] = None,
        args: Annotated[
            list[str] | None,
            typer.Option("--args", help="arguments appended to the command (repeatable)"),
        ] = None,
        runtime: Annotated[
            str | None,
            typer.Option("--runtime", help="runtimeVersion, e.g. tf-1.7.0-py3, tfplus-1.6.0-gpu"),
        ] = None,
        wcount: Annotated[int | None, typer.Option("--wcount", help="workerCount")] = None,
        workertype: Annotated[
            str | None, typer.Option("--workertype", help="workerType, aUbGcP e.g. 1U2G1P")
        ] = None,
        pscount: Annotated[
            int | None, typer.Option("--pscount", help="parameterServerCount")
        ] = None,
        pstype: Annotated[
            str | None, typer.Option("--pstype", help="parameterServerType, aUbGcP")
        ] = None,
        mastertype: Annotated[
            str | None, typer.Option("--mastertype", help="masterType, aUbGcP (adds a master)")
        ] = None,
        package_dir: Annotated[
            list[str] | None,
            typer.Option(
                "--package-dir", help="code/data/output paths, comma-separated or repeated"
            ),
        ] = None,
        output: OutputOpt = Output.table,
    ) -> None:
        """Create a TI job (tictl job create)."""
        s = ctx.obj
        payload = job_payload(
            name,
            cluster=cluster,
            command=command,
            region=region,
            args=args,
            runtime=runtime,
            wcount=wcount,
            workertype=workertype,
            pscount=pscount,
            pstype=pstype,
            mastertype=mastertype,
            package_dir=package_dir,
        )
        with _reported(s), s.client() as client:
            answer = TiApi(client).create(payload)
        if output is Output.json:
            typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
        else:
            s.out.print(
                Text(
                    f"job {answer.get('name', name)} created in cluster "
                    f"{answer.get('cluster', cluster)}: {answer.get('state')}"
                    f" (id {answer.get('id')})"
                )
            )
        _warn(s, answer)

    @job_app.command("get")
    def get(
        ctx: typer.Context, name: NameArg, cluster: ClusterOpt, output: OutputOpt = Output.table
    ) -> None:
        """Show a TI job (tictl job get)."""
        s = ctx.obj
        with _reported(s), s.client() as client:
            view = TiApi(client).get(cluster, name)
        if output is Output.json:
            typer.echo(json.dumps(view, indent=2, ensure_ascii=False))
        else:
            _print_view(s, view)

    @job_app.command("list")
    def list_jobs(
        ctx: typer.Context,
        cluster: Annotated[str | None, typer.Option("--cluster", help="only this cluster")] = None,
        limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500)] = 20,
        output: OutputOpt = Output.table,
    ) -> None:
        """List TI jobs, newest first (tictl job list)."""
        s = ctx.obj
        with _reported(s), s.client() as client:
            page = TiApi(client).list(cluster, limit=limit)
        if output is Output.json:
            typer.echo(json.dumps(page, indent=2, ensure_ascii=False))
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("NAME", "CLUSTER", "STATE", "CREATED", "STARTED", "ENDED"):
            table.add_column(column, no_wrap=True)
        table.add_column("MESSAGE")
        for job in page.get("jobs") or ():
            table.add_row(
                *(
                    _show(job.get(k))
                    for k in (
                        "name",
                        "cluster",
                        "state",
                        "createTime",
                        "startTime",
                        "endTime",
                        "message",
                    )
                )
            )
        if page.get("jobs"):
            s.out.print(table)
        s.err.print(
            Text(f"{len(page.get('jobs') or [])} of {page.get('total', 0)} job(s)", style="dim")
        )

    @job_app.command("delete")
    def delete(ctx: typer.Context, name: NameArg, cluster: ClusterOpt) -> None:
        """Stop a TI job (tictl job delete)."""
        s = ctx.obj
        with _reported(s), s.client() as client:
            TiApi(client).delete(cluster, name)
        s.out.print(Text(f"job {name} in cluster {cluster}: stop requested"))

    return ti_app

"""``yard``: the command line for Trainyard.

Results go to stdout (``-o json`` gives the server's JSON untouched, for scripts);
diagnostics go to stderr. Exit codes: 0 ok, 1 an error or a job that did not succeed,
2 bad usage, 130 interrupted.

The app is built by :func:`make_app` from a client factory, so tests (and embedders)
hand in a client wired to their own transport instead of patching this module.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from .client import (
    Client,
    Job,
    TrainyardError,
    WaitTimeout,
    discover_token,
    is_terminal,
    load_payload,
)
from .kubeconfig import KubeconfigError, kubeconfig, locate
from .ti_cli import make_ti_app

ClientFactory = Callable[[str | None, str | None], Client]

STATE_STYLES = {
    "SUCCEEDED": "green",
    "RUNNING": "cyan",
    "FAILED": "red",
    "REJECTED": "red",
    "STOPPED": "yellow",
    "STARTING": "blue",
    "PLACED": "blue",
    "QUEUED": "magenta",
    "PAUSED": "yellow",
}

# Envelope fields every event carries; the events table shows what is particular.
EVENT_ENVELOPE = {"event_id", "job_id", "occurred_at", "schema_version", "type", "seq"}


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


OutputOpt = Annotated[
    Output,
    typer.Option(
        "--output", "-o", help="table (short ids) or wide for people, json or yaml for scripts"
    ),
]
JobIdArg = Annotated[
    str, typer.Argument(metavar="ID", help="job id, the start of one (as tables show) or its name")
]
TimeoutOpt = Annotated[float | None, typer.Option(help="give up after this many seconds")]
URL_HELP = "gateway URL \\[env: YARD_URL; default http://127.0.0.1:8080]"
TOKEN_HELP = "bearer token \\[env: YARD_TOKEN; else <YARD_DATA_DIR or ./.data>/admin-token]"


# Control characters but a line's end and a tab: in a job's name, a reason (git's
# message from a remote, a task's exit) or an event, text a terminal would run as a
# command (an escape sequence that recolours, retitles or rewrites the screen).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _Shown:
    """A renderable whose text comes out with each control character as ``?``; the
    console's own styling (its segments' styles and control codes) is untouched."""

    def __init__(self, inner: ConsoleRenderable) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            if segment.control is None and _CONTROL.search(segment.text):
                yield Segment(_CONTROL.sub("?", segment.text), segment.style)
            else:
                yield segment


class _Printable(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Shown(r) for r in renderables]


def _console(**options: Any) -> Console:
    console = Console(highlight=False, **options)
    console.push_render_hook(_Printable())
    return console


class Session:
    """Per-invocation state: global options and the consoles. Consoles are made per
    run so they see the streams (and terminal) of this run; what they print shows a
    control character of the text it prints as ``?``."""

    def __init__(self, connect: ClientFactory, url: str | None, token: str | None) -> None:
        self._connect = connect
        self.url = url
        self.token = token
        self.out = _console()
        if not self.out.is_terminal and "COLUMNS" not in os.environ:
            # Piped into grep or a file: rows must stay whole lines, not wrap at 80.
            self.out.width = 1000
        self.err = _console(stderr=True, soft_wrap=True)

    def client(self) -> Client:
        return self._connect(self.url, self.token)

    def error(self, message: str) -> None:
        self.err.print(Text("error: ", style="bold red") + Text(message))


@contextmanager
def reported(session: Session) -> Iterator[None]:
    """Turns the client's errors into one line on stderr and exit code 1."""
    try:
        yield
    except TrainyardError as exc:
        session.error(str(exc))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        session.err.print("interrupted")
        raise typer.Exit(130) from None


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"yard {version('trainyard-sdk')}")
        raise typer.Exit()


def make_app(connect: ClientFactory = Client) -> typer.Typer:
    app = typer.Typer(
        name="yard",
        help="Submit, watch and manage Trainyard training jobs.",
        no_args_is_help=True,
        # `yard --install-completion` (bash, zsh, fish, PowerShell).
        add_completion=True,
        # Locals in a traceback would print the bearer token.
        pretty_exceptions_show_locals=False,
    )
    token_app = typer.Typer(help="Manage API tokens (admin).", no_args_is_help=True)
    app.add_typer(token_app, name="token")
    admin_app = typer.Typer(help="Platform maintenance (admin).", no_args_is_help=True)
    app.add_typer(admin_app, name="admin")

    @admin_app.command("rebuild")
    def admin_rebuild(
        ctx: typer.Context,
        apply: Annotated[
            bool, typer.Option("--apply", help="repair: make the views what the stream says")
        ] = False,
        output: OutputOpt = Output.table,
    ) -> None:
        """Rebuild the job views from the event stream and compare them with the live
        ones; exit 1 when they differ (and --apply was not given)."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            report = client.rebuild(apply=apply)
        if not _print_data(output, report):
            rebuilt = report.get("rebuilt") or {}
            s.out.print(Text(
                f"read {report['messages']} message(s) up to #{report['until_seq']}: "
                f"{rebuilt.get('jobs', 0)} job(s), {rebuilt.get('tasks', 0)} task(s), "
                f"{rebuilt.get('events', 0)} history event(s)"
            ))  # fmt: skip
            for d in report.get("differences") or []:
                left = f" (left: {d['left']})" if d.get("left") else ""
                s.out.print(Text(f"  {d['collection']} {d['id']}: {d['difference']}{left}"))
            verdict = "repaired" if report.get("applied") else "differ"
            s.out.print(Text(
                "the live views are what the stream says" if not report["different"]
                else f"{report['different']} document(s) {verdict}"
            ))  # fmt: skip
        if report["different"] and not report.get("applied"):
            raise typer.Exit(1)

    app.add_typer(make_nodes_app(), name="nodes")
    app.add_typer(make_ti_app(), name="ti")

    @app.command("kubeconfig")
    def kubeconfig_command(
        ctx: typer.Context,
        server: Annotated[
            str | None,
            typer.Option(help="the Kubernetes API URL \\[env: YARD_KUBE_URL; else the platform's]"),
        ] = None,
        ca_file: Annotated[
            str | None,
            typer.Option(help="its CA certificate \\[env: YARD_KUBE_CA; else the platform's]"),
        ] = None,
        namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
        file: Annotated[
            Path | None, typer.Option("--file", "-f", help="write it here (mode 600)")
        ] = None,
    ) -> None:
        """A kubeconfig for the platform's Kubernetes API (kubectl, the Kubernetes and
        Kubeflow SDKs): its HTTPS URL, the platform's CA and your token.
        `yard kubeconfig -f ~/.kube/trainyard && KUBECONFIG=~/.kube/trainyard kubectl get
        pytorchjobs`."""
        s: Session = ctx.obj
        token = s.token or discover_token()[0]
        if not token:
            s.error("no token: pass --token or set YARD_TOKEN")
            raise typer.Exit(1)
        try:
            url, ca_pem = locate(server, ca_file)
        except KubeconfigError as exc:
            s.error(str(exc))
            raise typer.Exit(1) from None
        text = yaml.safe_dump(kubeconfig(url, ca_pem, token, namespace), sort_keys=False)
        if file is None:
            print(text, end="")
            return
        file.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # a file there before keeps its mode otherwise
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        s.err.print(Text(f"wrote {file}"))

    @app.callback()
    def main(
        ctx: typer.Context,
        url: Annotated[str | None, typer.Option("--url", help=URL_HELP)] = None,
        token: Annotated[str | None, typer.Option("--token", help=TOKEN_HELP)] = None,
        _version: Annotated[
            bool,
            typer.Option("--version", callback=show_version, is_eager=True, help="and exit"),
        ] = False,
    ) -> None:
        ctx.obj = Session(connect, url, token)

    @app.command()
    def queue(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
        """The jobs waiting to be placed, in order, with why each waits (yours; an admin's:
        everyone's)."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            rows = client.queue()
        if _print_data(output, rows):
            return
        wide = output is Output.wide
        _table(
            s,
            ["#", "ID", "NAME", "USER", "QUEUE", "PRIO", "WHY"],
            [
                [
                    _cell(r.get("position")),
                    _id(r.get("job_id"), wide),
                    _cell(r.get("name")),
                    _cell(r.get("user")),
                    _cell(r.get("queue")),
                    _cell(r.get("priority")),
                    _cell("; ".join(r.get("reasons") or [])),
                ]
                for r in rows
            ],  # fmt: skip
            wrap="WHY",
        )
        if not rows:
            s.err.print(Text("nothing waits", style="dim"))

    @app.command()
    def why(ctx: typer.Context, job_id: JobIdArg) -> None:
        """Why a job is where it is: what it waits for, why it failed or was refused."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            job = client.get(job_id)
        for line in explain(job):
            s.out.print(Text(line))

    @app.command()
    def submit(
        ctx: typer.Context,
        file: Annotated[str, typer.Argument(help="job file (JSON or YAML); - reads stdin")],
        dialect: Annotated[
            str | None,
            typer.Option("--dialect", "-d", help="openpai or native; default: detected"),
        ] = None,
        wait: Annotated[
            bool, typer.Option("--wait", "-w", help="follow the job; exit 1 unless it succeeds")
        ] = False,
        timeout: TimeoutOpt = None,
        output: OutputOpt = Output.table,
    ) -> None:
        """Submit a job; prints its id."""
        s: Session = ctx.obj
        with reported(s):
            payload = _read_job_file(file)
            with s.client() as client:
                answer = client.submit(payload, dialect=dialect)
                if not _print_data(output, answer):
                    typer.echo(answer["id"])
                    for warning in answer.get("warnings") or ():
                        s.err.print(Text("warning: ", style="yellow") + Text(_issue_text(warning)))
                    for issue in answer.get("errors") or ():
                        s.err.print(Text("error: ", style="bold red") + Text(_issue_text(issue)))
                if answer.get("state") == "REJECTED":
                    raise typer.Exit(1)
                if wait:
                    _follow(s, client, answer["id"], timeout)

    @app.command()
    def validate(
        ctx: typer.Context,
        file: Annotated[str, typer.Argument(help="job file (JSON or YAML); - reads stdin")],
        dialect: Annotated[
            str | None, typer.Option("--dialect", "-d", help="default: detected")
        ] = None,
        output: OutputOpt = Output.table,
    ) -> None:
        """Check a job without submitting it; exit 1 when it would be rejected."""
        s: Session = ctx.obj
        with reported(s):
            payload = _read_job_file(file)
            with s.client() as client:
                answer = client.validate(payload, dialect=dialect)
        if not _print_data(output, answer):
            verdict = "valid" if answer["valid"] else "invalid"
            s.out.print(Text(f"{verdict} {answer['dialect']} job"))
            for error in answer.get("errors") or ():
                s.out.print(Text("error: ", style="red") + Text(_issue_text(error)))
            for warning in answer.get("warnings") or ():
                s.out.print(Text("warning: ", style="yellow") + Text(_issue_text(warning)))
        if not answer["valid"]:
            raise typer.Exit(1)

    @app.command("wait")
    def wait_cmd(
        ctx: typer.Context,
        job_id: JobIdArg,
        timeout: TimeoutOpt = None,
    ) -> None:
        """Follow a job until it ends; exit 1 unless it succeeded."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            _follow(s, client, job_id, timeout)

    @app.command()
    def get(
        ctx: typer.Context,
        job_id: JobIdArg,
        output: OutputOpt = Output.table,
        watch: Annotated[
            bool, typer.Option("--watch", "-w", help="then a line per change, until it ends")
        ] = False,
    ) -> None:
        """Show a job and its tasks."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            if not watch:
                job = client.get(job_id)
                if not _print_data(output, job):
                    _print_job(s.out, job)
                return
            # Read once the server follows the job (nothing after that read is missed),
            # and again at each change it reports.
            seen: Any = None
            for change in client.watch(job_id):
                if not (change.get("connected") or change.get("reset")):
                    if change.get("id") != job_id:
                        continue
                job = client.get(job_id)
                key = _watch_key(job)
                if seen is None:
                    if not _print_data(output, job):
                        _print_job(s.out, job)
                elif key != seen:
                    _print_change(s, output, job)
                seen = key
                if is_terminal(job.get("state")):
                    return

    @app.command("ls")
    def ls(
        ctx: typer.Context,
        state: Annotated[str | None, typer.Option("--state", "-s", help="only this state")] = None,
        user: Annotated[str | None, typer.Option("--user", "-u", help="only this user")] = None,
        limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="page size")] = 20,
        offset: Annotated[int, typer.Option(min=0, help="skip this many (newest first)")] = 0,
        queue: Annotated[str | None, typer.Option("--queue", "-q", help="only this queue")] = None,
        dialect: Annotated[str | None, typer.Option(help="only jobs sent in this dialect")] = None,
        name: Annotated[str | None, typer.Option(help="only names starting so")] = None,
        kind: Annotated[str | None, typer.Option(help="only this kind (pytorch, mpi, ...)")] = None,
        label: Annotated[
            list[str] | None, typer.Option("--label", "-l", help="key=value (repeat: all of them)")
        ] = None,
        output: OutputOpt = Output.table,
        watch: Annotated[
            bool, typer.Option("--watch", "-w", help="then a line per job change, until Ctrl-C")
        ] = False,
    ) -> None:
        """List jobs, newest first."""
        s: Session = ctx.obj
        filters: dict[str, Any] = {"queue": queue, "dialect": dialect, "name": name,
                                   "kind": kind, "label": label or None}  # fmt: skip
        if watch:
            with reported(s), s.client() as client:
                for change in client.watch():
                    if change.get("connected"):
                        _print_list(s, output, client, state, user, limit, offset, filters)
                    elif "id" in change and (not user or change.get("user") == user):
                        if not state or change.get("state") == state.upper():
                            _print_change(s, output, change)
            return
        with reported(s), s.client() as client:
            _print_list(s, output, client, state, user, limit, offset, filters)

    def _print_list(
        s: Session, output: Output, client: Client, state: str | None, user: str | None,
        limit: int, offset: int, filters: dict[str, Any],
    ) -> None:  # fmt: skip
        page = client.list(
            state=state.upper() if state else None, user=user, limit=limit, offset=offset,
            **filters,
        )  # fmt: skip
        if _print_data(output, page):
            return
        items = page.get("items") or []
        wide = output is Output.wide
        headers = ["ID", "NAME", "USER", "STATE", *(["QUEUE", "KIND"] if wide else []),
                   "DIALECT", "SUBMITTED", "REASON"]  # fmt: skip
        rows = [
            [
                _id(job.get("id"), wide), _cell(job.get("name")), _cell(job.get("user")),
                _state(job.get("state")),
                *([_cell(job.get("queue")), _cell(job.get("kind"))] if wide else []),
                _cell(job.get("dialect")), _cell(_time(job.get("submitted_at"))),
                _cell(job.get("reason")),
            ]
            for job in items
        ]  # fmt: skip
        if items:
            _table(s, headers, rows)
        total = page.get("total", len(items))
        # The service counts up to a bound: past it, it says so.
        of = f"{total}" if page.get("total_exact", True) else f"at least {total}"
        start = page.get("offset", offset)
        shown = f"{start + 1}-{start + len(items)}" if items else "0"
        s.err.print(Text(f"{shown} of {of} job(s)", style="dim"))

    @app.command()
    def events(
        ctx: typer.Context,
        job_id: JobIdArg,
        output: OutputOpt = Output.table,
    ) -> None:
        """Show a job's event history, oldest first."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            items = client.events(job_id)
        if _print_data(output, items):
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        table.add_column("SEQ", justify="right")
        table.add_column("TIME", no_wrap=True)
        table.add_column("TYPE", no_wrap=True)
        table.add_column("DETAILS", overflow="fold")
        for item in items:
            table.add_row(
                _cell(item.get("seq")),
                _cell(_time(item.get("occurred_at"))),
                _cell(item.get("type")),
                _cell(_event_details(item.get("event") or {})),
            )
        s.out.print(table)

    @app.command()
    def logs(
        ctx: typer.Context,
        job_id: JobIdArg,
        role: Annotated[str | None, typer.Option("--role", "-r", help="task role")] = None,
        index: Annotated[int | None, typer.Option("--index", "-i", min=0, help="task index")] = (
            None
        ),
        stderr: Annotated[bool, typer.Option("--stderr", help="stderr instead of stdout")] = False,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="until the task ends")] = False,
    ) -> None:
        """Print a task's log."""
        s: Session = ctx.obj
        stream = "stderr" if stderr else "stdout"
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            if follow:
                # A job just submitted may still be queued: follow from when it starts.
                client.wait(job_id, until_terminal=False)
            try:
                chunks = client.logs(job_id, role=role, index=index, stream=stream, follow=follow)
                for chunk in chunks:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            except BrokenPipeError:
                # `yard logs ID | head` closed the pipe: the reader has what it wanted.
                # Point stdout at devnull so the flush at exit does not fail again.
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                raise typer.Exit(0) from None

    @app.command("exec")
    def exec_cmd(
        ctx: typer.Context,
        job_id: JobIdArg,
        role: Annotated[str, typer.Argument(help="task role")],
        index: Annotated[int, typer.Argument(min=0, help="task index")],
        command: Annotated[list[str], typer.Argument(help="the command, after --")],
        timeout: Annotated[float, typer.Option(help="kill it after this many seconds")] = 60.0,
    ) -> None:
        """Run a command in a running task (e.g. a debug-mode job's): `yard exec ID ROLE
        INDEX -- CMD...`. Exits with the command's exit code (124 when it timed out)."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            answer = client.exec(job_id, role, index, command, timeout=timeout)
        sys.stdout.write(answer.get("stdout") or "")
        sys.stdout.flush()
        sys.stderr.write(answer.get("stderr") or "")
        if answer.get("timed_out"):
            s.error(f"the command was killed after {timeout:g}s")
            raise typer.Exit(124)
        code = answer.get("exit_code")
        raise typer.Exit(code if isinstance(code, int) else 1)

    @app.command()
    def stop(ctx: typer.Context, job_id: JobIdArg) -> None:
        """Ask for a job to be stopped."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            client.stop(job_id)
        s.out.print(Text(f"stop requested for {job_id}"))

    @app.command()
    def pause(
        ctx: typer.Context,
        job_id: JobIdArg,
        reason: Annotated[str | None, typer.Option(help="why, shown with the job")] = None,
    ) -> None:
        """Pause a job: its tasks end and its capacity is freed until `yard resume`."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            client.pause(job_id, reason=reason)
        s.out.print(Text(f"pause requested for {job_id}"))

    @app.command()
    def resume(ctx: typer.Context, job_id: JobIdArg) -> None:
        """Resume a paused job: it is queued again as its next attempt."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            client.resume(job_id)
        s.out.print(Text(f"resume requested for {job_id}"))

    @app.command()
    def restart(
        ctx: typer.Context,
        job_id: JobIdArg,
        reason: Annotated[str | None, typer.Option(help="why, shown with the job")] = None,
    ) -> None:
        """Restart a job as its next attempt (no retry spent): a running attempt ends first,
        a paused job is resumed."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            client.restart(job_id, reason=reason)
        s.out.print(Text(f"restart requested for {job_id}"))

    @app.command()
    def scale(
        ctx: typer.Context,
        job_id: JobIdArg,
        role: Annotated[str, typer.Option("--role", "-r", help="an elastic role")],
        replicas: Annotated[int, typer.Option("--replicas", "-n", help="its new size")],
    ) -> None:
        """Resize an elastic role within its min/max; a running job restarts at that size."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            job_id = client.resolve(job_id)
            client.scale(job_id, role, replicas)
        s.out.print(Text(f"scale of {job_id} role {role} to {replicas} requested"))

    @token_app.command("create")
    def token_create(
        ctx: typer.Context,
        user: Annotated[str, typer.Argument(help="user the token acts as")],
        admin: Annotated[bool, typer.Option("--admin", help="grant admin rights")] = False,
        output: OutputOpt = Output.table,
    ) -> None:
        """Issue a token for USER; prints the token."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            answer = client.create_token(user, admin=admin)
        if not _print_data(output, answer):
            typer.echo(answer["token"])
            kind = "admin token" if admin else "token"
            note = f"{kind} for {answer.get('user', user)}; shown once, keep it safe"
            s.err.print(Text(note, style="dim"))

    @token_app.command("revoke-user")
    def token_revoke_user(
        ctx: typer.Context,
        user: Annotated[str, typer.Argument(help="user whose credentials end")],
        output: OutputOpt = Output.table,
    ) -> None:
        """Revoke every token and AccessKey of USER, those it made for itself too."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            answer = client.revoke_user(user)
        if not _print_data(output, answer):
            s.out.print(
                Text(
                    f"revoked {answer['tokens']} token(s) and {answer['access_keys']} "
                    f"access key(s) of {answer['user']}"
                )
            )

    return app


def make_nodes_app() -> typer.Typer:
    nodes_app = typer.Typer(
        help="List and administer the nodes placement schedules onto (admin).",
        invoke_without_command=True,
    )

    @nodes_app.callback()
    def nodes_list(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
        """List the nodes: state, capacity, allocated and free (without a subcommand)."""
        if ctx.invoked_subcommand is not None:
            return
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            nodes = client.nodes()
        if _print_data(output, nodes):
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        for name in ("NAME", "STATE", "CPU", "MEMORY MB", "GPUS", "GPU TYPE", "JOBS"):
            table.add_column(name, no_wrap=True)
        table.add_column("LABELS")
        for node in nodes:
            capacity, allocated = node.get("capacity") or {}, node.get("allocated") or {}
            table.add_row(
                _cell(node.get("name")),
                Text(
                    str(node.get("state")),
                    style="yellow" if node.get("state") == "drained" else "green",
                ),
                _cell(_used(allocated.get("cpu"), capacity.get("cpu"))),
                _cell(_used(allocated.get("memory_mb"), capacity.get("memory_mb"))),
                _cell(_used(allocated.get("gpus"), capacity.get("gpus"))),
                _cell(node.get("gpu_type")),
                _cell(len(node.get("jobs") or [])),
                _cell(",".join(f"{k}={v}" for k, v in (node.get("labels") or {}).items())),
            )
        s.out.print(table)

    @nodes_app.command("add")
    def nodes_add(
        ctx: typer.Context,
        name: Annotated[str, typer.Option("--name", help="node name")],
        cpu: Annotated[float, typer.Option("--cpu", help="CPU cores")],
        memory_mb: Annotated[int, typer.Option("--memory-mb", help="memory in MiB")],
        gpus: Annotated[int, typer.Option("--gpus", min=0, help="GPU devices")] = 0,
        gpu_type: Annotated[str | None, typer.Option("--gpu-type", help="GPU model")] = None,
        host_ip: Annotated[
            str | None, typer.Option("--host-ip", help="address of the node")
        ] = None,
        label: Annotated[list[str] | None, typer.Option("--label", help="k=v, repeatable")] = None,
        output: OutputOpt = Output.table,
    ) -> None:
        """Add a node to the cluster."""
        s: Session = ctx.obj
        labels = []
        for item in label or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                s.error(f"--label: expected k=v, got {item!r}")
                raise typer.Exit(2)
            labels.append({"name": key, "value": value})
        spec: dict[str, Any] = {
            "name": name,
            "cpu": cpu,
            "memory_mb": memory_mb,
            "gpus": gpus,
            "labels": labels,
        }
        if gpu_type:
            spec["gpu_type"] = gpu_type
        if host_ip:
            spec["host_ip"] = host_ip
        with reported(s), s.client() as client:
            node = client.add_node(spec)
        if not _print_data(output, node):
            s.out.print(Text(f"node {node.get('name', name)} added"))

    @nodes_app.command("drain")
    def nodes_drain(ctx: typer.Context, name: Annotated[str, typer.Argument(help="node")]) -> None:
        """Place nothing new on the node; what runs there keeps running."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            client.drain_node(name)
        s.out.print(Text(f"node {name} drained"))

    @nodes_app.command("undrain")
    def nodes_undrain(
        ctx: typer.Context, name: Annotated[str, typer.Argument(help="node")]
    ) -> None:
        """Let the node take new tasks again."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            client.undrain_node(name)
        s.out.print(Text(f"node {name} ready"))

    @nodes_app.command("remove")
    def nodes_remove(ctx: typer.Context, name: Annotated[str, typer.Argument(help="node")]) -> None:
        """Remove the node; jobs running on it are interrupted and queued again."""
        s: Session = ctx.obj
        with reported(s), s.client() as client:
            answer = client.remove_node(name)
        interrupted = answer.get("interrupted") or []
        note = (
            f"; interrupted {len(interrupted)} job(s): {', '.join(interrupted)}"
            if (interrupted)
            else ""
        )
        s.out.print(Text(f"node {name} removed{note}"))

    return nodes_app


def _used(allocated: Any, capacity: Any) -> str | None:
    if capacity is None:
        return None
    return f"{allocated if allocated is not None else 0:g}/{capacity:g}"


# -- helpers ------------------------------------------------------------------


def _follow(s: Session, client: Client, job_id: str, timeout: float | None) -> None:
    def show(job: Job) -> None:
        s.err.print(_change_line(job, job_id))

    try:
        job = client.wait(job_id, timeout=timeout, on_change=show)
    except WaitTimeout as exc:
        s.error(f"{exc}; the job goes on")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        s.err.print(f"stopped following {job_id}; the job goes on")
        raise typer.Exit(130) from None
    if job.get("state") == "SUCCEEDED":
        return
    for issue in job.get("errors") or ():
        s.err.print(Text("  - ") + Text(_issue_text(issue)))
    failed = [t for t in job.get("tasks") or () if t.get("state") == "FAILED"]
    for task in failed:
        s.err.print(
            Text(
                f"  task {task.get('role')}[{task.get('index')}] exit code "
                f"{task.get('exit_code')}: {task.get('reason') or 'failed'}"
            )
        )
    reason = f": {job['reason']}" if job.get("reason") else ""
    s.error(f"job {job_id} {job.get('state')}{reason}")
    raise typer.Exit(1)


def explain(job: Job) -> list[str]:
    """A job's state in sentences (``yard why``)."""
    state = job.get("state")
    lines = [f"{job.get('name') or job.get('id')} is {state}"
             + (f" (attempt {job['attempt']})" if (job.get("attempt") or 1) > 1 else "")]  # fmt: skip
    if state in ("SUBMITTED", "ACCEPTED"):
        lines.append("it is being checked; placement takes it next")
    if state == "QUEUED" or job.get("queue_reasons"):
        where = job.get("queue_position")
        lines.append(
            f"it waits in queue {job.get('queue')}" + (f", position {where}" if where else "")
        )
        lines += [f"  - {reason}" for reason in job.get("queue_reasons") or []]
    if state == "REJECTED":
        lines.append("it was refused:")
        lines += [f"  - {_issue_text(issue)}" for issue in job.get("errors") or []]
    if state in ("FAILED", "STOPPED", "PAUSED") and job.get("reason"):
        lines.append(f"because: {job['reason']}")
    if job.get("failure_class"):
        lines.append(f"failure put down to: {job['failure_class']}")
    for task in job.get("tasks") or []:
        if task.get("state") == "FAILED":
            lines.append(
                f"  task {task.get('role')}[{task.get('index')}] on {task.get('node') or '-'}: "
                f"exit code {task.get('exit_code')}, {task.get('reason') or 'failed'}"
                + (f" ({task['failure_class']})" if task.get("failure_class") else "")
            )
    if state in ("RUNNING", "PLACED", "SUCCEEDED") and job.get("reason"):
        lines.append(job["reason"])
    return lines


def _watch_key(job: Job) -> tuple[Any, ...]:
    tasks = tuple((t.get("role"), t.get("index"), t.get("state")) for t in job.get("tasks") or ())
    return job.get("state"), job.get("reason"), job.get("attempt"), tasks


def _print_change(s: Session, output: Output, job: Job) -> None:
    """One line per change of a watched job (JSON: one object per line)."""
    if output is Output.json:
        typer.echo(json.dumps(job, default=str))
        return
    s.out.print(_change_line(job, f"{job.get('id')} {job.get('name') or ''}"))


def _change_line(job: Job, label: str) -> Text:
    """``<time> <label> <STATE>  tasks: ...  (reason)``: one line of a followed job."""
    when = _time(job.get("updated_at"))
    line = Text(f"{when} ", style="dim") if when else Text()
    line += Text(f"{label} ") + _state(job.get("state"))
    counts = _task_counts(job.get("tasks") or [])
    if counts:
        line += Text(f"  tasks: {counts}")
    if job.get("reason"):
        line += Text(f"  ({job['reason']})")
    return line


def _print_job(out: Console, job: Job) -> None:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("ID", job.get("id")),
        ("Name", job.get("name")),
        ("User", job.get("user")),
        ("State", _state(job.get("state"))),
        ("Reason", job.get("reason")),
        ("Dialect", job.get("dialect")),
        ("Attempt", job.get("attempt")),
        ("Submitted", _time(job.get("submitted_at"))),
        ("Updated", _time(job.get("updated_at"))),
        ("Finished", _time(job.get("finished_at"))),
        ("Exit code", job.get("exit_code")),
    ]
    for label, value in rows:
        if value is not None and value != "":
            head.add_row(label, value if isinstance(value, Text) else _cell(value))
    out.print(head)

    errors = job.get("errors") or []
    if errors:
        table = Table(
            title="Errors",
            title_justify="left",
            title_style="bold red",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        table.add_column("PATH", overflow="fold")
        table.add_column("MESSAGE", overflow="fold")
        table.add_column("CODE")
        for issue in errors:
            if isinstance(issue, dict):
                table.add_row(*(_cell(issue.get(k)) for k in ("path", "message", "code")))
            else:
                table.add_row("-", _cell(issue), "-")
        out.print(table)
    for title, items, style in (
        ("Warnings", job.get("warnings") or [], "yellow"),
        ("Queue reasons", job.get("queue_reasons") or [], "magenta"),
    ):
        if items:
            out.print(Text(title, style=f"bold {style}"))
            for item in items:
                out.print(Text("  - ") + Text(_issue_text(item)))

    tasks = job.get("tasks") or []
    if not tasks:
        out.print(Text("no tasks yet", style="dim"))
        return
    table = Table(
        title="Tasks",
        title_justify="left",
        title_style="bold",
        header_style="bold",
        box=None,
        pad_edge=False,
    )
    for name in ("ROLE", "INDEX", "ATTEMPT", "STATE", "EXIT", "NODE", "GPUS"):
        numeric = name in ("INDEX", "ATTEMPT", "EXIT")
        table.add_column(name, no_wrap=True, justify="right" if numeric else "left")
    table.add_column("PORTS", overflow="fold")
    table.add_column("REASON", overflow="fold")
    for task in tasks:
        table.add_row(
            _cell(task.get("role")),
            _cell(task.get("index")),
            _cell(task.get("attempt")),
            _state(task.get("state")),
            _cell(task.get("exit_code")),
            _cell(task.get("node") or task.get("host_ip")),
            _cell(",".join(str(g) for g in task.get("gpu_indices") or []) or None),
            _cell(_ports(task.get("ports") or [])),
            _cell(task.get("reason")),
        )
    out.print(table)


def _ports(ports: list[Any]) -> str | None:
    parts = []
    for entry in ports:
        if isinstance(entry, dict):
            numbers = ",".join(str(p) for p in entry.get("ports") or [])
            parts.append(f"{entry.get('label')}:{numbers}")
        else:
            parts.append(str(entry))
    return " ".join(parts) or None


def _task_counts(tasks: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for task in tasks:
        state = str(task.get("state"))
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def _event_details(event: dict[str, Any]) -> str:
    parts = []
    for key, value in event.items():
        if key in EVENT_ENVELOPE or value is None or isinstance(value, dict | list):
            continue
        text = str(value)
        parts.append(f"{key}={text if len(text) <= 60 else text[:57] + '...'}")
    return " ".join(parts)


def _read_job_file(file: str) -> Any:
    if file == "-":
        return load_payload("<stdin>", sys.stdin.read())
    path = Path(file)
    if not path.is_file():
        raise TrainyardError(f"{file}: no such file")
    return load_payload(path)


def _issue_text(issue: Any) -> str:
    if isinstance(issue, dict):
        where = issue.get("path")
        message = issue.get("message") or json.dumps(issue)
        return f"{where}: {message}" if where else str(message)
    return str(issue)


SHORT_ID = 8


def _id(value: Any, wide: bool = False) -> Text:
    """A job id as tables show it: its first 8 digits (every command takes them), the
    whole of it with ``-o wide``."""
    text = "-" if not value else str(value)
    return Text(text if wide or len(text) != 32 else text[:SHORT_ID])


def _table(s: Session, headers: list[str], rows: list[list[Text]], wrap: str = "REASON") -> None:
    """Rows for people on a terminal (aligned; the ``wrap`` column folds to fit the
    width, the others never wrap), or, piped, one line per row with its cells between
    tabs: no padding, no colour, for cut and awk."""
    if not s.out.is_terminal:
        lines = ["\t".join(headers)]
        lines += ["\t".join(cell.plain.replace("\t", " ").replace("\n", " ") for cell in row)
                  for row in rows]  # fmt: skip
        typer.echo("\n".join(lines))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in headers:
        if name == wrap:
            table.add_column(name, overflow="fold", ratio=1)
        else:
            table.add_column(name, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    s.out.print(table)


def _id_column(table: Table, items: list[dict[str, Any]]) -> None:
    # Ids are what people copy into the next command: never cut one.
    width = max((len(str(i.get("id"))) for i in items), default=2)
    table.add_column("ID", no_wrap=True, min_width=width)


def _cell(value: Any) -> Text:
    # Text, not str: names and reasons come from users and must not be read as markup.
    return Text("-" if value is None or value == "" else str(value))


def _state(state: str | None) -> Text:
    if not state:
        return Text("-")
    style = STATE_STYLES.get(state, "")
    if is_terminal(state):
        style = f"bold {style}".strip()
    return Text(state, style=style)


def _time(value: Any) -> str | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _print_data(output: Output, data: Any) -> bool:
    """Print ``data`` as JSON or YAML when asked; False for the tables."""
    if output is Output.json:
        _print_json(data)
    elif output is Output.yaml:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n"))
    else:
        return False
    return True


app = make_app()

"""Distributed training across tasks the launcher started, through the whole platform:
XGBoost with its Rabit tracker next to rank 0, an MPI allreduce through mpirun and the
local rsh agent (a native job, and T9k's MPIJob), and PyTorch DDP over gloo when torch
is available. Each job installs its packages into its own virtualenv from a wheelhouse
downloaded once (kept in .cache/test-wheels, so later runs are offline and fast)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_stack.platform import Platform

from .conftest import CLUSTER, Api, start_platform, unique

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".cache" / "test-wheels" / "frameworks"
TORCH_WHEELHOUSE = REPO / ".cache" / "test-wheels" / "torch"
PACKAGES = ["xgboost-cpu", "mpi4py"]
TORCH_WANTED = os.environ.get("YARD_TEST_TORCH") == "1"
T9K = "/apis/batch.tensorstack.dev/v1beta1/namespaces/frameworks"


def _download(packages: list[str], into: Path, work: Path) -> str | None:
    """Fill ``into`` with wheels of ``packages`` and their dependencies; why not, or None."""
    stamp = into / (".ok-" + "-".join(sorted(packages)))
    if stamp.exists():
        return None
    into.mkdir(parents=True, exist_ok=True)
    venv = work / "pip-venv"
    # The jobs' own virtualenvs are made the same way, so the wheels fit them.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
            str(into),
            *packages,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        return f"cannot download {' '.join(packages)}: {proc.stdout[-300:]}{proc.stderr[-500:]}"
    stamp.touch()
    return None


@pytest.fixture(scope="module")
def wheelhouses(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    problem = _download(PACKAGES, WHEELHOUSE, tmp_path_factory.mktemp("pip"))
    if problem is not None:
        pytest.skip(f"no wheels for the framework jobs ({problem}); PyPI unreachable?")
    if not TORCH_WANTED:
        return [WHEELHOUSE]
    # Apart: torch and its CUDA libraries are gigabytes.
    if problem := _download(["torch"], TORCH_WHEELHOUSE, tmp_path_factory.mktemp("pip-torch")):
        pytest.fail(f"YARD_TEST_TORCH=1 but torch could not be downloaded: {problem}")
    return [WHEELHOUSE, TORCH_WHEELHOUSE]


def platform_on(root: Path, cluster: dict[str, Any], wheelhouses: list[Path]) -> Platform:
    """A whole platform on ``cluster`` whose jobs install packages from the wheelhouses."""
    links = " ".join(f"--find-links {w}" for w in wheelhouses)
    return start_platform(root, cluster, extra_env={"YARD_PIP_ARGS": f"--no-index {links}"})


@pytest.fixture(scope="module")
def fw_api(tmp_path_factory: pytest.TempPathFactory, wheelhouses: list[Path]) -> Iterator[Api]:
    platform = platform_on(tmp_path_factory.mktemp("fw-platform"), CLUSTER, wheelhouses)
    yield Api(platform.url, platform.token)
    platform.stop()


def script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def run_to_end(api: Api, spec: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    job_id = api.submit(spec)
    view = api.wait(job_id, timeout=timeout)
    if view["state"] != "SUCCEEDED":
        logs = api.http.get(f"/v1/jobs/{job_id}/logs", params={"stream": "stderr"}).text
        raise AssertionError(f"{view}\n--- stderr ---\n{logs[-4000:]}")
    return view


def role(name: str, replicas: int, command: str, memory_mb: int = 2048) -> dict[str, Any]:
    # The launcher holds a task to its memory (as an address-space limit where cgroups
    # are not available), and numpy, xgboost and torch map far more than they use.
    return {
        "name": name,
        "replicas": replicas,
        "command": command,
        "resources": {"cpu": 1, "memory_mb": memory_mb},
    }


# ----------------------------------------------------------------------------- XGBoost

XGBOOST_TRAIN = """
    import json, os, sys
    import numpy as np
    import xgboost as xgb
    from xgboost import collective

    out = sys.argv[1]
    args = {"dmlc_communicator": "rabit",
            "dmlc_tracker_uri": os.environ["DMLC_TRACKER_URI"],
            "dmlc_tracker_port": int(os.environ["DMLC_TRACKER_PORT"]),
            "dmlc_task_id": os.environ["DMLC_TASK_ID"]}
    with collective.CommunicatorContext(**args):
        rank, world = collective.get_rank(), collective.get_world_size()
        # Each worker trains on its own shard; only the allreduce makes the models agree.
        rng = np.random.default_rng(100 + int(os.environ["DMLC_TASK_ID"]))
        X = rng.normal(size=(2000, 5))
        y = (X[:, 0] + 0.5 * X[:, 1] - X[:, 2] > 0).astype(int)
        booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist",
                             "max_depth": 4, "eta": 0.3}, xgb.DMatrix(X, label=y), 20)
        test = np.random.default_rng(7).normal(size=(1000, 5))
        truth = (test[:, 0] + 0.5 * test[:, 1] - test[:, 2] > 0).astype(int)
        predicted = (booster.predict(xgb.DMatrix(test)) > 0.5).astype(int)
        booster.save_model(os.path.join(out, f"model-{rank}.json"))
        with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "accuracy": float((predicted == truth).mean()),
                       "task_id": os.environ["DMLC_TASK_ID"],
                       "role": os.environ["TRAINYARD_ROLE"]}, f)
"""


def test_xgboost_trains_one_model_across_two_workers(fw_api: Api, out_dir: Path) -> None:
    train = script(out_dir, "train.py", XGBOOST_TRAIN)
    command = f"python {train} {out_dir}"
    run_to_end(
        fw_api,
        {
            "name": unique("xgb"),
            "kind": "xgboost",
            "pip_packages": ["xgboost-cpu"],
            "roles": [role("master", 1, command), role("worker", 1, command)],
        },
    )

    results = [json.loads((out_dir / f"result-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in results] == [2, 2], results
    assert {(r["role"], r["task_id"]) for r in results} == {("master", "0"), ("worker", "1")}
    assert all(r["accuracy"] > 0.9 for r in results), results
    # Different shards, one model: the workers' histograms were allreduced every round.
    models = [(out_dir / f"model-{r}.json").read_bytes() for r in (0, 1)]
    assert models[0] == models[1]
    trees = json.loads(models[0])["learner"]["gradient_booster"]["model"]["trees"]
    assert len(trees) == 20


# --------------------------------------------------------------------------------- MPI

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI is not installed (tools/setup-system.sh installs openmpi-bin as root)",
)

MPI_ALLREDUCE = """
    import json, os, sys
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
    gathered = comm.allgather(os.environ["TRAINYARD_INDEX"])
    with open(os.path.join(sys.argv[1], f"rank-{comm.Get_rank()}.json"), "w") as f:
        json.dump({"rank": comm.Get_rank(), "size": comm.Get_size(), "sum": total,
                   "gathered": gathered, "role": os.environ["TRAINYARD_ROLE"],
                   "index": os.environ["TRAINYARD_INDEX"],
                   "session": os.environ.get("OMPI_FILE_LOCATION", ""),
                   "python": sys.executable}, f)
"""


@needs_mpirun
def test_mpirun_from_the_launcher_allreduces_across_two_workers(fw_api: Api, out_dir: Path) -> None:
    program = script(out_dir, "allreduce.py", MPI_ALLREDUCE)
    run_to_end(
        fw_api,
        {
            "name": unique("mpi"),
            "kind": "mpi",
            "pip_packages": ["mpi4py"],
            "roles": [
                # Kubeflow MPIJob's shape: the launcher runs mpirun, the workers host the ranks.
                role("launcher", 1, f"mpirun -np 2 python {program} {out_dir}"),
                role("worker", 2, "/usr/sbin/sshd -De"),
            ],
        },
    )

    ranks = [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["size"], r["sum"]) for r in ranks] == [(2, 3), (2, 3)], ranks
    # One rank in each worker task's environment (its own TRAINYARD_INDEX, the job's venv).
    assert {(r["role"], r["index"]) for r in ranks} == {("worker", "0"), ("worker", "1")}
    assert sorted(ranks[0]["gathered"]) == ["0", "1"]
    assert all("/venv/" in r["python"] for r in ranks), ranks
    # Each worker's ranks keep Open MPI's session directory under a base of that worker's
    # own (two daemons making one directory at once fail Open MPI 4's orte_session_dir).
    bases = [
        next((p for p in Path(r["session"]).parts if p.startswith("trainyard-mpi-")), None)
        for r in ranks
    ]
    assert None not in bases and len(set(bases)) == 2, ranks


@needs_mpirun
def test_a_t9k_mpijob_runs_its_cmd_under_mpirun_on_every_worker(fw_api: Api, out_dir: Path) -> None:
    name = unique("t9k-mpi")
    code = (
        f"import os; open(os.path.join({str(out_dir)!r}, 'rank-' + os.environ['OMPI_COMM_WORLD_RANK']), 'w')"
        ".write(os.environ['OMPI_COMM_WORLD_SIZE'] + ' ' + os.environ['TRAINYARD_INDEX'])"
    )
    payload = {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "worker": {
                "replicas": 2,
                "cmd": ["python3", "-c", code],
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "mpi-worker",
                                "image": "python:3.11",
                                "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                            }
                        ]
                    }
                },
            }
        },
    }
    answer = fw_api.http.post(
        f"{T9K}/mpijobs",
        content=yaml.safe_dump(payload),
        headers={"Content-Type": "application/yaml"},
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["metadata"]["uid"]
    view = fw_api.wait(job_id, timeout=120)
    stderr = fw_api.http.get(f"/v1/jobs/{job_id}/logs", params={"stream": "stderr"}).text
    assert view["state"] == "SUCCEEDED", (view, stderr[-3000:])
    # Worker 0 ran mpirun over both workers: one rank in each, two in the world.
    assert sorted((out_dir / f"rank-{r}").read_text() for r in (0, 1)) == ["2 0", "2 1"]


# ----------------------------------------------------------------------------- PyTorch


def _torch_installed() -> bool:
    """Whether a job's virtualenv sees torch without installing it: the jobs' venvs are
    made with --system-site-packages of this interpreter's base installation."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    return subprocess.run([str(base), "-c", "import torch"], capture_output=True).returncode == 0


TORCH_INSTALLED = not TORCH_WANTED and _torch_installed()


def _torch_problem() -> str | None:
    if TORCH_WANTED or TORCH_INSTALLED:
        return None
    return (
        "torch is not installed and YARD_TEST_TORCH is not 1: torch's PyPI wheel brings "
        "gigabytes of CUDA libraries; set YARD_TEST_TORCH=1 to download it and run this"
    )


DDP_TRAIN = """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different data per rank; DDP keeps the weights equal
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    for _ in range(200):
        x = torch.randn(64, 4)
        loss = ((model(x) - x @ w.T) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    with open(os.path.join(sys.argv[1], f"ddp-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "loss": loss.item(),
                   "weight": model.module.weight.detach().flatten().tolist()}, f)
    dist.destroy_process_group()
"""


@pytest.mark.skipif(_torch_problem() is not None, reason=_torch_problem() or "")
@pytest.mark.timeout(1800)  # installing torch's gigabytes into the job's virtualenv
def test_pytorch_ddp_over_gloo_across_two_workers(fw_api: Api, out_dir: Path) -> None:
    train = script(out_dir, "ddp.py", DDP_TRAIN)
    command = f"python {train} {out_dir}"
    packages = [] if TORCH_INSTALLED else ["torch"]
    run_to_end(
        fw_api,
        {
            "name": unique("ddp"),
            "kind": "pytorch",
            "pip_packages": packages,
            "roles": [role("master", 1, command, 8192), role("worker", 1, command, 8192)],
        },
        timeout=1500,
    )
    results = [json.loads((out_dir / f"ddp-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in results] == [2, 2]
    assert results[0]["weight"] == results[1]["weight"]
    assert results[0]["weight"] == pytest.approx([1.0, -2.0, 0.5, 3.0], abs=0.05)


# ------------------------------------------------------------- PyTorch DDP, NCCL on GPUs


def _gpu_count() -> int:
    """The GPUs nvidia-smi lists on this machine (0 without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in proc.stdout.splitlines())


GPUS = _gpu_count()


def _nccl_problem() -> str | None:
    if GPUS == 0:
        return "no GPU here (nvidia-smi lists none): the NCCL run needs a GPU machine"
    return _torch_problem()


@pytest.fixture(scope="module")
def gpu_api(tmp_path_factory: pytest.TempPathFactory, wheelhouses: list[Path]) -> Iterator[Api]:
    # The machine's real GPUs, so CUDA_VISIBLE_DEVICES names devices that exist.
    cluster = {
        "nodes": [
            {
                "name": "gpu-node",
                "cpu": float(os.cpu_count() or 2),
                "memory_mb": 65536,
                "gpus": GPUS,
                "gpu_type": "GPU",
                "port_range": [33000, 33999],
            }
        ]
    }
    platform = platform_on(tmp_path_factory.mktemp("gpu-platform"), cluster, wheelhouses)
    yield Api(platform.url, platform.token)
    platform.stop()


GLOO_INIT = 'dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK'
assert GLOO_INIT in DDP_TRAIN
NCCL_TRAIN = (
    DDP_TRAIN.replace(
        GLOO_INIT,
        """\
dist.init_process_group("nccl")  # env://, as for gloo
    # The launcher's CUDA_VISIBLE_DEVICES leaves each task its own placed GPU(s).
    torch.cuda.set_device(0)
    assert torch.cuda.device_count() == 1, os.environ.get("CUDA_VISIBLE_DEVICES")""",
    )
    .replace("torch.nn.Linear(4, 1))", "torch.nn.Linear(4, 1).cuda(), device_ids=[0])")
    .replace("torch.randn(64, 4)", "torch.randn(64, 4, device='cuda')")
    .replace(
        "torch.tensor([[1.0, -2.0, 0.5, 3.0]])",
        "torch.tensor([[1.0, -2.0, 0.5, 3.0]], device='cuda')",
    )
)


@pytest.mark.skipif(_nccl_problem() is not None, reason=_nccl_problem() or "")
@pytest.mark.timeout(1800)
def test_pytorch_ddp_over_nccl_on_the_placed_gpus(gpu_api: Api, out_dir: Path) -> None:
    # NCCL refuses two ranks on one device: with one GPU the world is a single rank (the
    # launcher's GPU placement and NCCL's init are still real), with two or more, two.
    world = 2 if GPUS >= 2 else 1
    train = script(out_dir, "ddp_nccl.py", NCCL_TRAIN)
    command = f"python {train} {out_dir}"
    roles = [
        {**role("master", 1, command, 16384), "resources": {"cpu": 1, "memory_mb": 16384, "gpu": 1}}
    ]
    if world == 2:
        roles.append(
            {
                **role("worker", 1, command, 16384),
                "resources": {"cpu": 1, "memory_mb": 16384, "gpu": 1},
            }
        )
    packages = [] if TORCH_INSTALLED else ["torch"]
    run_to_end(
        gpu_api,
        {"name": unique("ddp-nccl"), "kind": "pytorch", "pip_packages": packages, "roles": roles},
        timeout=1500,
    )
    results = [json.loads((out_dir / f"ddp-{r}.json").read_text()) for r in range(world)]
    assert [r["world"] for r in results] == [world] * world
    assert all(r["weight"] == results[0]["weight"] for r in results)
    assert results[0]["weight"] == pytest.approx([1.0, -2.0, 0.5, 3.0], abs=0.05)

"""The placement speed and replay benchmarks run (--quick) on tiny trace files and report
what they promise. No timing is asserted: speed goals live in bench/, not in tests."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from ..support.bench import load_bench

NODES = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase," \
    "creation_time,deletion_time,scheduled_time\n"  # fmt: skip


load = load_bench


def run(module: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert module.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def write_trace(tmp_path: Path, nodes: list[str], pods: list[str]) -> list[str]:
    (tmp_path / "nodes.csv").write_text(NODES + "\n".join(nodes) + "\n")
    (tmp_path / "pods.csv").write_text(PODS + "\n".join(pods) + "\n")
    return ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]


def test_speed_reports_each_figure_with_its_goal_and_the_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shapes = ["4000,8192,1,500", "8000,16384,1,1000", "2000,4096,0,0", "16000,32768,2,1000",
              "64000,131072,8,1000"]  # fmt: skip
    files = write_trace(
        tmp_path,
        ["n0,96000,393216,8,G2", "n1,32000,131072,2,T4", "n2,16000,65536,0,"],
        [f"p{i:03},{shapes[i % len(shapes)]},,LS,Running,{i},{i + 100},{i}" for i in range(30)],
    )
    report = run(
        load("placement_speed"),
        [*files, "--quick", "--synthetic-nodes", "16", "--synthetic-pods", "80"],
        capsys,
    )

    assert report["policy"] == "trainyard" and report["baseline"] == "first-fit"
    openb = report["openb"]
    assert openb["cluster"] == {"nodes": 2, "gpus": 10}
    for figures in openb["policies"].values():
        assert figures["decisions"] == 30
        assert figures["placed"] + figures["refused"] == 30
        # 8 + 2 GPUs: the 8-GPU pods after the first cannot all fit.
        assert 0 < figures["placed"] < 30
        assert figures["decisions_per_s"] > 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert set(openb["policies"]) == {"trainyard", "first-fit"}
    assert openb["trainyard_vs_first-fit"]["decisions_per_s"] > 0

    synthetic = report["synthetic"]
    assert synthetic["cluster"] == {"nodes": 16, "gpus": 128}
    assert synthetic["tasks"] == 80
    assert 2 <= synthetic["gangs"] <= 40  # 2 to 64 tasks each
    gang = synthetic["gang_64_tasks"]
    assert gang["trainyard"]["empty_cluster"]["placed"] is True  # 64 of 128 GPUs free
    assert gang["trainyard"]["empty_cluster"]["p50_ms"] > 0

    goals = report["goals"]
    assert set(goals) == {"decisions_per_s", "p99_ms", "gang_64_ms"}
    assert goals["decisions_per_s"]["goal"] == ">= 1000"
    assert goals["p99_ms"]["goal"] == "< 5"
    assert goals["gang_64_ms"]["goal"] == "< 20"
    for figure in goals.values():
        assert figure["met"] == (
            figure["value"] >= 1000 if figure["goal"] == ">= 1000"
            else figure["value"] < float(figure["goal"][2:])
        )  # fmt: skip
    assert report["all_goals_met"] == all(g["met"] for g in goals.values())


def test_replay_waits_for_departures_on_the_simulated_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One node of two GPUs; p2 arrives at 20 while p0 and p1 hold both GPUs, and starts
    # when p1 leaves at 10 + 50 = 60: a wait of 40 s under either scheduler.
    files = write_trace(
        tmp_path,
        ["n0,32000,65536,2,T4"],
        ["p0,4000,8192,1,1000,,LS,Running,0,100,0",
         "p1,4000,8192,1,1000,,LS,Running,10,60,10",
         "p2,4000,8192,1,1000,,LS,Running,20,50,20"],
    )  # fmt: skip
    report = run(load("placement_replay"), [*files, "--quick"], capsys)

    assert report["cluster"] == {"nodes": 1, "gpus": 2}
    assert report["pod_count"] == 3
    assert set(report["schedulers"]) == {"trainyard", "fifo-first-fit"}
    for result in report["schedulers"].values():
        assert result["placed"] == 3 and result["never_placed"] == 0
        # --quick compresses arrivals 300x; durations stay: p2 arrives at 20/300 s and
        # waits for p1's departure at 10/300 + 50 s.
        assert result["wait_s"]["waited"] == 1
        assert result["wait_s"]["max"] == pytest.approx(10 / 300 + 50 - 20 / 300, abs=0.1)
        assert result["wait_s"]["p50"] == 0
        series = result["allocation_over_time"]
        assert series[0]["alloc_pct"] == 50.0 and series[-1]["alloc_pct"] == 100.0
        assert all(0 <= point["alloc_pct"] <= 100 for point in series)
        assert 50 <= result["allocation_mean_pct"] <= 100
    assert report["comparison"]["mean_wait_ratio"] == 1.0


def test_replay_refuses_a_pod_list_without_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nodes.csv").write_text(NODES + "n0,32000,65536,2,T4\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                       "p0,4000,8192,1,1000\n")  # fmt: skip
    replay = load("placement_replay")
    with pytest.raises(SystemExit):
        replay.main(["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")])
    assert "no creation_time/deletion_time" in capsys.readouterr().err


def test_outside_definitions_counts_what_each_dialect_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kubeflow").mkdir()
    (tmp_path / "openpai").mkdir()
    good = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "a"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
            "containers": [{"name": "pytorch", "image": "i", "command": ["true"]}]}}}}},
    }  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    (tmp_path / "kubeflow" / "two.yaml").write_text(
        "\n---\n".join(
            json.dumps(d) for d in (good, service, {**good, "apiVersion": "kubeflow.org/v9"})
        )
    )
    (tmp_path / "openpai" / "broken.json").write_text('{"jobName": // a comment\n}')
    (tmp_path / "openpai" / "cm.yaml").write_text(json.dumps(service))
    report = run(load("outside_definitions"), [str(tmp_path)], capsys)
    kubeflow, openpai = report["platforms"]["kubeflow"], report["platforms"]["openpai"]
    assert (kubeflow["documents"], kubeflow["translated"]) == (2, 1)
    assert kubeflow["refused"][0]["file"] == "kubeflow/two.yaml"
    assert "$.apiVersion" in kubeflow["refused"][0]["errors"][0]
    assert (openpai["files"], openpai["unreadable"], openpai["no_job"]) == (2, 1, 1)


def test_mixes_vary_one_class_of_pods_to_the_level_asked(tmp_path: Path) -> None:
    mixes = load("mixes")
    rows = ["c0,1000,100,0,0", "c1,1000,100,0,0"]
    rows += [f"s{i},1000,100,1,{300 + i}" for i in range(4)]
    rows += [f"w{i},1000,100,1,1000" for i in range(3)] + ["m0,1000,100,4,1000"]
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "\n".join(r + "," for r in rows) + "\n"
    )  # fmt: skip
    pods = mixes.load(tmp_path / "pods.csv")
    rng = mixes.random.Random(3)
    gpu = lambda out: [p for p in out if mixes.gpu_of(p) > 0]  # noqa: E731

    def sharing_share(out: list[dict[str, str]]) -> float:
        held = sum(mixes.demand(p) for p in out if mixes.is_sharing(p))
        return held / sum(map(mixes.demand, out))

    shared = mixes.mix(pods, "share", 0.5, rng)  # a share of the GPU demand, as the paper's
    assert len(shared) == 10 and len(gpu(shared)) == 8
    assert 0.4 <= sharing_share(shared) <= 0.6
    assert sharing_share(mixes.mix(pods, "share", 0.1, rng)) <= 0.2
    assert all(map(mixes.is_sharing, gpu(mixes.mix(pods, "share", 1.0, rng))))
    assert not any(map(mixes.is_sharing, mixes.mix(pods, "share", 0.0, rng)))
    multi = mixes.mix(pods, "multi", 0.6, rng)
    held = sum(mixes.demand(p) for p in multi if mixes.gpu_of(p) >= 2)
    assert held / sum(map(mixes.demand, multi)) >= 0.6
    assert sum(1 for p in multi if mixes.gpu_of(p) >= 2) > 1  # drawn again, added
    fewer = mixes.mix(pods, "multi", 0.0, rng)
    assert all(mixes.gpu_of(p) < 2 for p in fewer)
    spec = mixes.mix(pods, "spec", 0.25, rng, ["T4", "V100M16|V100M32"])
    assert sum(1 for p in spec if p["gpu_spec"]) == 2
    assert all(not p["gpu_spec"] for p in spec if mixes.gpu_of(p) == 0)
    cpu = mixes.mix(pods, "cpu", 0.6, rng)  # CPU-only pods: 60 % of all pods
    assert sum(1 for p in cpu if mixes.gpu_of(p) == 0) == 12 and len(gpu(cpu)) == 8
    assert len({p["name"] for p in cpu}) == len(cpu)  # every pod its own name
    with pytest.raises(ValueError):
        mixes.mix(pods, "nope", 0.5, rng)
    with pytest.raises(ValueError):
        mixes.mix(pods, "cpu", 1.0, rng)
    # A level that is not a share is refused, never looped on (multi 40 added multi-GPU
    # pods for ever, 6 GB in ten minutes, before this).
    for family, level in [("share", 1.5), ("spec", 2.0), ("cpu", -0.1), ("share", -0.5),
                          ("multi", 1.0), ("multi", 40.0)]:  # fmt: skip
        with pytest.raises(ValueError, match=f"{family}: the level is a share"):
            mixes.mix(pods, family, level, rng, ["T4"])
    # Two families in turn: no sharing pod left, then a quarter of the GPU pods
    # constrained, from the command line as in the suite.
    both = mixes.mix_in_turn(pods, [("share", 0.0), ("spec", 0.25)], rng, ["T4"])
    assert not any(map(mixes.is_sharing, both))
    assert sum(1 for p in both if p["gpu_spec"] == "T4") == 2
    out = tmp_path / "both.csv"
    specs = tmp_path / "specs.csv"
    specs.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nx,1,1,1,1000,A10\n")
    argv = ["--pods", str(tmp_path / "pods.csv"), "--specs", str(specs)]
    assert mixes.main([*argv, "--family", "share", "--level", "0", "--then", "spec", "0.25",
                       "--out", str(out)]) == 0  # fmt: skip
    written = mixes.load(out)
    assert not any(map(mixes.is_sharing, written))
    assert sum(1 for p in written if p["gpu_spec"] == "A10") == 2
    with pytest.raises(SystemExit):
        mixes.main([*argv, "--family", "share", "--level", "0", "--then", "gpu", "1",
                    "--out", str(out)])  # fmt: skip
    assert mixes.name_of(("share", 0.05), ("spec", 0.3)) == "mix_share005_spec030"


def test_placement_mixes_compares_the_policy_with_fgd_on_every_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load("placement_quality")  # what placement_mixes imports
    # Small GPU shares: the arrived workload passes through every percent.
    shapes = ["1000,2048,1,100", "2000,4096,1,150", "1000,1024,0,0", "1000,2048,1,50"]
    files = write_trace(
        tmp_path,
        ["n0,96000,393216,8,G2", "n1,32000,131072,2,T4"],
        [f"p{i:03},{shapes[i % len(shapes)]},,LS,Running,{i},{i + 100},{i}" for i in range(120)],
    )
    for part in ("develop", "held_out"):
        (tmp_path / part).mkdir()
        (tmp_path / part / "mix_a.csv").write_text((tmp_path / "pods.csv").read_text())
    report = run(
        load("placement_mixes"), [str(tmp_path), "--nodes", files[1], "--seeds", "1,2"], capsys
    )
    assert report["seeds"] == [1, 2]
    for part in ("develop", "held_out"):
        figures = report[part]["mix_a"]["alloc_rate_at_100"]
        assert set(figures) == {"trainyard", "fgd", "lead", "ahead_level_behind"}
        assert sum(figures["ahead_level_behind"]) == 2
        assert 0 < figures["fgd"]["mean"] <= 100
        assert figures["lead"] == pytest.approx(
            figures["trainyard"]["mean"] - figures["fgd"]["mean"], abs=0.02
        )

"""Task extraction (keys equal at extraction and build time, occurrences, shares), the task
scheduler's allocation logic, and the tasks / tune model commands."""
from __future__ import annotations

import json

import pytest

from tuner.cli import main
from workloads.graph import load
from workloads.graph.fusion import describe
from tuner.tasks import TaskScheduler, TaskState, extract_tasks, fuse, shares
from workloads.fused import workload_for_group

INCEPTION = "workloads/graphs/inception_block.txt"


@pytest.mark.parametrize("level", [2, 3])
def test_extraction_keys_equal_build_time_keys(level):
    """The tasks `tasks`/`tune model` extract are exactly the workloads the builder chooses
    (its own planning step, ``plan_groups``, on the graph its own pipeline produced)."""
    from tuner.compiler.compile_model import plan_groups

    graph = load(INCEPTION)
    tasks = extract_tasks(graph, opt_level=level)
    _, kernels, _, _, _ = plan_groups(fuse(load(INCEPTION), level), threads=1, store=None,
                                          tuned=False)
    built = [k.workload for k in kernels.values()]
    assert None not in built                    # every kernel has a workload
    assert {t.key for t in tasks} == {w.key for w in built}
    # ... and from the group's description alone (what a rebuilt description gives).
    for name, k in kernels.items():
        assert workload_for_group(describe(k.node)).key in {t.key for t in tasks}
    assert sum(t.occurrences for t in tasks) == len(built)
    assert abs(sum(shares(tasks)) - 1) < 1e-9
    assert [t.weight for t in tasks] == sorted((t.weight for t in tasks), reverse=True)


def test_equal_groups_merge_into_one_task_with_occurrences():
    text = open("workloads/graphs/mlp.txt").read()
    tasks = extract_tasks(load("workloads/graphs/mlp.txt"))
    assert all(t.occurrences == 1 for t in tasks)
    from workloads.graph import GraphBuilder
    import numpy as np
    b = GraphBuilder("rep")
    x = b.input("x", (4, 16))
    for seed in range(3):
        w = b.const(np.random.default_rng(seed).random((16, 16), dtype=np.float32))
        x = b.op("relu", b.op("dense", x, w))
    (task,) = extract_tasks(b.build(x))
    assert task.occurrences == 3 and len(task.groups) == 3 and text


def states(*specs):
    return [TaskState(i, occ, best, cap) for i, (occ, best, cap) in enumerate(specs)]


def test_scheduler_first_round_each_then_largest_gain():
    st = states((1, 10.0, None), (4, 5.0, None), (1, 1.0, 1), (2, 0.1, None))
    s = TaskScheduler(st, budget=64, round_size=8)
    order = []
    while (pick := s.next()) is not None:
        task, n = pick
        order.append(task.index)
        # Task 1 improves a lot each round; the others do not.
        s.update(task, n, task.trials + n, task.best * (0.5 if task.index == 1 else 1.0))
    assert order[:3] == [1, 0, 3]            # heaviest first; task 2 has one config: never
    assert 2 not in order
    alloc = s.allocation()
    assert sum(alloc.values()) == 64 == s.spent
    assert alloc[1] > alloc[0] > 0 and alloc[3] >= 8
    assert max(alloc, key=alloc.get) == 1


def test_scheduler_probes_defaults_before_spending_rounds():
    """The nominal estimate says task 0 is heaviest; its measured default says otherwise. The
    probe (one trial: the default config) costs 1 trial per untuned task; the first full round
    then goes to the task that is heaviest by measurement. A task with records is not probed."""
    st = states((1, 10.0, None), (1, 1.0, None))
    st.append(TaskState(2, 1, 0.5, None, trials=16))    # tuned before: its time is a record
    real = {0: 0.1, 1: 1.0, 2: 0.5}
    s = TaskScheduler(st, budget=2 + 8, round_size=8)
    log = []
    while (pick := s.next()) is not None:
        task, n = pick
        log.append((task.index, n))
        s.update(task, n, task.trials + n, real[task.index])
    assert log == [(0, 1), (1, 1), (1, 8)]
    assert s.states[1].rounds == 1 and s.states[0].rounds == 0 and s.states[0].previous is None


def test_scheduler_respects_budget_and_exhausted_spaces():
    st = states((1, 1.0, 5), (1, 1.0, 3))
    s = TaskScheduler(st, budget=100, round_size=4)
    while (pick := s.next()) is not None:
        task, n = pick
        s.update(task, n, task.trials + n, task.best)
    assert s.allocation() == {0: 5, 1: 3}
    s = TaskScheduler(states((1, 1.0, None)), budget=6, round_size=4)
    while (pick := s.next()) is not None:
        s.update(pick[0], pick[1], pick[0].trials + pick[1], 1.0)
    assert s.spent == 6
    with pytest.raises(Exception):
        TaskScheduler([], budget=-1)


def test_tasks_command_lists_and_marks_tuned(db_url, capsys):
    assert main(["tasks", INCEPTION, "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kinds = {r["kind"] for r in report["tasks"]}
    # -O 2: the concatenation runs in place (no task); -O 3 (NHWC): a gather kernel
    assert kinds == {"conv2d", "dense", "fixed"} | ({"injective"} if report["opt_level"] == 3 else set())
    assert not any(r["tuned"] for r in report["tasks"])
    assert main(["tasks", "no/such/model.onnx"]) == 2
    assert "error:" in capsys.readouterr().err


def test_tune_model_spends_the_budget_and_records(db_url, capsys, tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("""graph m(%x: float32[2, 8]) {
  %w = const(init="normal", seed=1) : float32[8, 8]
  %d = dense(%x, %w)
  %r = relu(%d)
  return %r
}""")
    rc = main(["tune", "model", str(path), "--trials", "2", "--threads", "1", "--strategy", "random",
               "--batch-size", "2", "--repeat", "3", "--min-repeat-ms", "2", "--log", "", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spent"] == 2 and report["tasks"][0]["trials"] == 2
    # the end-to-end before/after: both builds measured in this run, same numbers computed
    e = report["end_to_end"]
    assert e["samples"]["defaults"] >= 3 and e["samples"]["tuned"] >= 3
    assert e["defaults"]["p25_ms"] <= e["defaults"]["p50_ms"] <= e["defaults"]["p75_ms"]
    assert e["speedup"] == pytest.approx(e["defaults"]["p50_ms"] / e["tuned"]["p50_ms"])
    assert e["max_abs_diff"] < 1e-4 and sum(e["tuned_counts"].values()) == 1
    assert main(["tasks", str(path), "--threads", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["tasks"]
    assert row["tuned"] and row["time_source"] == "record"
    assert main(["tune", "model", "--trials", "2"]) == 2
    # more trials measured with --cache-flush would be ranked with these: refused up front
    capsys.readouterr()
    assert main(["tune", "model", str(path), "--trials", "4", "--threads", "1", "--cache-flush",
                 "--log", "", "--no-end-to-end"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured without --cache-flush" in err

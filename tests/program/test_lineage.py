"""The Program parent forest: chains, explicit roots, late parents, cycle refusal, model scoping."""

from __future__ import annotations

import pytest

from progrouter.program.core.lineage import ProgramLineage

pytestmark = pytest.mark.timeout(30)


def test_multi_level_chain_explicit_root_and_late_parent() -> None:
    lineage = ProgramLineage()
    assert lineage.observe("m", "lead") == "lead"
    assert lineage.observe("m", "child", "lead") == "lead"
    assert lineage.observe("m", "grandchild", "child") == "lead"
    assert lineage.observe("m", "external", None, "lead") == "lead"
    assert lineage.root_readonly("m", "grandchild") == "lead"
    # A child whose parent is not known yet roots at the parent, and re-roots when the parent links up.
    assert lineage.observe("m", "late-child", "late-parent") == "late-parent"
    assert lineage.observe("m", "late-parent", "lead") == "lead"
    assert lineage.root_readonly("m", "late-child") == "lead"
    assert lineage.root("m", "late-child") == "lead"


def test_a_link_that_would_close_a_cycle_is_refused() -> None:
    lineage = ProgramLineage()
    lineage.observe("m", "b", "a")
    lineage.observe("m", "c", "b")
    # a -> c would make a cycle a -> c -> b -> a: refused, a stays a root.
    assert lineage.observe("m", "a", "c") == "a"
    assert lineage.root_readonly("m", "c") == "a"
    # Self-parenting is ignored.
    assert lineage.observe("m", "d", "d") == "d"


def test_root_wins_over_parent_when_both_are_given() -> None:
    lineage = ProgramLineage()
    lineage.observe("m", "child", "parent", "root")
    assert lineage.root_readonly("m", "child") == "root"
    assert lineage.root_readonly("m", "parent") == "parent"


def test_path_compression_points_nodes_at_the_root() -> None:
    lineage = ProgramLineage()
    for i in range(1, 50):
        lineage.observe("m", f"n{i}", f"n{i - 1}")
    assert lineage.root("m", "n49") == "n0"
    # After compression each walked node is one hop from the root.
    assert lineage._parents[("m", "n25")] == ("m", "n0")


def test_model_pools_are_separate_forests() -> None:
    lineage = ProgramLineage()
    lineage.observe("m1", "child", "lead")
    assert lineage.root_readonly("m2", "child") == "child"
    assert lineage.root_readonly("m1", "child") == "lead"
    assert lineage.root_readonly("m1", "unknown") == "unknown"
    assert len(lineage) == 1  # only observed Programs have an entry; "lead" is just a name


def test_forgetting_released_programs_keeps_the_forest_as_large_as_the_live_set() -> None:
    lineage = ProgramLineage()
    for i in range(1000):
        lineage.observe("m", f"p{i}", "lead", f"root{i}")
        lineage.forget("m", f"p{i}")
    assert len(lineage) == 0
    lineage.observe("m", "child", "parent")
    lineage.observe("m", "parent", "lead")
    lineage.forget("m", "parent")  # a live child of a released parent still resolves, to the parent's name
    assert lineage.root("m", "child") == "parent"
    assert len(lineage) == 1

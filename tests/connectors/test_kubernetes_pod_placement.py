"""What connectors.kubernetes.pod_placement writes: each index's node, the template's gates,
the patch that lets a gated pod go (the real API server runs them in
tests/k8s/test_kubernetes_pod_placement.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from connectors.kubernetes.pod_placement import (
    PLACEMENT_GATE,
    decode,
    encode,
    planned_node,
    pod_nodes,
    template_gates,
    ungate_patch,
)

HOST = "kubernetes.io/hostname"


class PatchTestFailed(Exception):
    pass


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    """RFC 6902's add, remove and test, enough for these patches (the API server applies
    them for real in tests/k8s)."""
    assert patch is not None
    result = copy.deepcopy(document)
    for op in patch:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key: Any = int(last) if isinstance(target, list) else last
        if op["op"] == "test":
            if target[key] != op["value"]:
                raise PatchTestFailed(op)
        elif op["op"] == "remove":
            del target[key]
        else:
            assert op["op"] == "add" and not isinstance(target, list)
            target[key] = op["value"]
    return result


def test_indexes_go_in_order_to_the_nodes_by_name_as_many_as_their_gpus_hold() -> None:
    assert pod_nodes(4, {"c": 2, "a": 4, "b": 2}, 2) == {0: "a", 1: "a", 2: "b", 3: "c"}
    assert pod_nodes(1, {"b": 8}, 8) == {0: "b"}
    assert pod_nodes(2, {"a": 4, "b": 0}, 2) == {0: "a", 1: "a"}  # b is given none


@pytest.mark.parametrize(
    ("replicas", "gpus", "per_pod"),
    [
        (4, None, 2),  # the plan says no GPUs per node: the node set only
        (4, {}, 2),
        (4, {"a": 8}, 0),  # pods that ask for no GPU
        (4, {"a": 3, "b": 5}, 2),  # not whole pods
        (4, {"a": 4, "b": 2}, 2),  # three pods' GPUs for four
        (2, {"a": 4, "b": 2}, 2),  # more than two pods' GPUs
        (2, {"a": 4, "b": -2}, 2),
    ],
)
def test_no_map_when_the_plans_gpus_are_not_whole_pods_for_each_index(
    replicas: int, gpus: dict[str, int] | None, per_pod: int
) -> None:
    assert pod_nodes(replicas, gpus, per_pod) is None


def test_the_map_round_trips_and_a_malformed_annotation_reads_as_none() -> None:
    placement = {0: "a", 1: "a", 2: "b"}
    assert decode(encode(placement)) == placement
    assert encode(placement) == '{"0": "a", "1": "a", "2": "b"}'
    for bad in (None, "", "not json", "[1, 2]", '{"x": "a", "1": 5, "2": ""}'):
        assert decode(bad) == {}
    assert decode('{"x": "a", "1": "b"}') == {1: "b"}
    assert decode('{"\u00b2": "a", "1": "b"}') == {1: "b"}  # a digit, not a decimal


def test_template_gates_keep_the_sites_own_and_add_or_take_off_ours() -> None:
    spec = {"schedulingGates": [{"name": "site.example/quota"}, {"name": PLACEMENT_GATE}]}
    assert template_gates(spec, gated=True) == [
        {"name": "site.example/quota"},
        {"name": PLACEMENT_GATE},
    ]
    assert template_gates(spec, gated=False) == [{"name": "site.example/quota"}]
    assert template_gates({}, gated=True) == [{"name": PLACEMENT_GATE}]
    assert template_gates({}, gated=False) == []


def _pod(index: int | None, **spec: Any) -> dict[str, Any]:
    annotations = {} if index is None else {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}


def test_the_patch_lifts_only_our_gate_and_names_the_node() -> None:
    pod = _pod(
        2,
        schedulingGates=[{"name": "site.example/quota"}, {"name": PLACEMENT_GATE}],
        nodeSelector={"pool": "gpu"},
        containers=[{"name": "c"}],
    )
    patched = apply_patch(pod, ungate_patch(pod, "node-b"))
    assert patched["spec"]["schedulingGates"] == [{"name": "site.example/quota"}]
    assert patched["spec"]["nodeSelector"] == {"pool": "gpu", HOST: "node-b"}
    assert patched["spec"]["containers"] == pod["spec"]["containers"]

    bare = _pod(0, schedulingGates=[{"name": PLACEMENT_GATE}])
    patched = apply_patch(bare, ungate_patch(bare, "node-a"))
    assert patched["spec"] == {"schedulingGates": [], "nodeSelector": {HOST: "node-a"}}
    # Without a node: only the gate goes (the template's node set still holds it).
    assert apply_patch(bare, ungate_patch(bare, None))["spec"] == {"schedulingGates": []}


def test_a_pod_without_our_gate_gets_no_patch_and_a_named_host_is_kept() -> None:
    assert ungate_patch(_pod(0, schedulingGates=[{"name": "site.example/quota"}]), "a") is None
    assert ungate_patch(_pod(0), "a") is None
    pinned = _pod(0, schedulingGates=[{"name": PLACEMENT_GATE}], nodeSelector={HOST: "x"})
    patched = apply_patch(pinned, ungate_patch(pinned, "a"))
    assert patched["spec"]["nodeSelector"] == {HOST: "x"}


def test_the_patch_is_refused_on_a_pod_whose_gates_moved_since_it_was_read() -> None:
    read = _pod(0, schedulingGates=[{"name": "site.example/quota"}, {"name": PLACEMENT_GATE}])
    now = _pod(0, schedulingGates=[{"name": PLACEMENT_GATE}, {"name": "site.example/quota"}])
    with pytest.raises(PatchTestFailed):
        apply_patch(now, ungate_patch(read, "a"))


def test_a_pod_goes_to_its_indexs_node_only_while_the_template_is_pinned_there() -> None:
    placement = {0: "a", 1: "b"}
    assert planned_node(_pod(1), placement, ["a", "b"]) == "b"
    assert planned_node(_pod(1), placement, []) == "b"
    assert planned_node(_pod(1), placement, ["c"]) is None  # moved since: an old map
    assert planned_node(_pod(2), placement, ["a", "b"]) is None
    assert planned_node(_pod(None), placement, ["a", "b"]) is None

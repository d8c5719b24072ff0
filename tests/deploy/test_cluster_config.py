"""The placement keys of `cluster`: an unknown group, a CPU/GPU or a non-positive amount in
`cluster.group_resources` is a config error naming the key (CPUs and GPUs per rank belong to each
group's own config)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rl_apps.cli import main
from rl_core.cluster import ClusterConfig
from rl_core.cluster.config import group_placement, use_placement


@pytest.mark.parametrize(("resources", "message"), [
    ({"policy": {"GPU": 1}}, "policy.GPU: CPUs and GPUs per rank are set by the group's own config"),
    ({"generation": {"rollout": 0}}, "generation.rollout: must be > 0, got 0"),
    ({"polcy": {"trainer": 1}}, "unknown worker group 'polcy'; the groups are generation, policy, reward_model"),
])
def test_bad_group_resources_are_refused(resources, message):
    with pytest.raises(ValidationError, match=message):
        ClusterConfig(group_resources=resources)


def test_the_cli_reports_them_with_the_key(capsys):
    assert main(["grpo", "cluster.group_resources={policy: {CPU: 2}}", "--print-config"]) == 2
    assert "cluster.group_resources" in capsys.readouterr().err
    assert main(["grpo", "cluster.placement_strategy=SPRAED", "--print-config"]) == 2
    assert "cluster.placement_strategy" in capsys.readouterr().err


def test_groups_take_the_placement_of_the_last_config():
    try:
        use_placement(ClusterConfig(placement_strategy="SPREAD", group_resources={"policy": {"trainer": 1}}))
        assert group_placement("policy") == ("SPREAD", {"trainer": 1})
        assert group_placement("generation") == ("SPREAD", {})
    finally:
        use_placement(ClusterConfig())
    assert group_placement("policy") == ("PACK", {})

"""PodPlacementConfig parsing (rules.config)."""

import pytest

from podplacement.rules.config import ConfigError, PlacementConfig, parse_duration


def test_defaults_from_empty_spec() -> None:
    cfg = PlacementConfig.from_object({"metadata": {"name": "cluster", "generation": 3}})
    assert cfg.image_inspection.cache_ttl_seconds == 6 * 3600
    assert cfg.image_inspection.max_retries == 5
    assert cfg.topology.max_candidate_nodes == 16
    assert cfg.preferred_platforms == ()
    assert cfg.generation == 3


def test_platform_weights_only_when_scoring_enabled() -> None:
    spec = {"plugins": {"nodeAffinityScoring": {"enabled": False, "platforms": [
        {"architecture": "arm64", "weight": 50}]}}}
    assert PlacementConfig.from_object({"spec": spec}).preferred_platforms == ()
    spec["plugins"]["nodeAffinityScoring"]["enabled"] = True
    (p,) = PlacementConfig.from_object({"spec": spec}).preferred_platforms
    assert (p.architecture, p.weight) == ("arm64", 50)


def test_duplicate_architecture_is_rejected() -> None:
    spec = {"plugins": {"nodeAffinityScoring": {"enabled": True, "platforms": [
        {"architecture": "arm64", "weight": 5}, {"architecture": "arm64", "weight": 6}]}}}
    with pytest.raises(ConfigError, match="duplicate"):
        PlacementConfig.from_object({"spec": spec})


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600), ("1h30m", 5400), ("90s", 90),
                                                ("250ms", 0.25)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "6", "h", "6x", "1h 2m"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_inspection_budget_defaults_to_300ms_and_stays_below_the_webhook_timeout() -> None:
    from podplacement.rules.admit.webhookconfig import DEFAULT_TIMEOUT_SECONDS
    from podplacement.rules.config import DEFAULT_INSPECTION_BUDGET, MAX_INSPECTION_BUDGET

    assert PlacementConfig.from_object({}).admission_inspection_budget == 0.3
    assert DEFAULT_INSPECTION_BUDGET < MAX_INSPECTION_BUDGET < DEFAULT_TIMEOUT_SECONDS
    spec = {"admission": {"inspectionBudget": "150ms"}}
    assert PlacementConfig.from_object({"spec": spec}).admission_inspection_budget == 0.15
    spec = {"admission": {"inspectionBudget": "0s"}}
    assert PlacementConfig.from_object({"spec": spec}).admission_inspection_budget == 0
    for bad in ("5s", "4001ms", "fast"):
        with pytest.raises(ConfigError, match="inspectionBudget"):
            PlacementConfig.from_object({"spec": {"admission": {"inspectionBudget": bad}}})


def test_fallback_operating_systems_default_to_linux_and_must_name_node_oses() -> None:
    assert PlacementConfig.from_object({}).fallback_operating_systems == ("linux",)
    spec = {"fallbackOperatingSystems": ["windows", "linux", "windows"]}
    assert PlacementConfig.from_object({"spec": spec}).fallback_operating_systems == (
        "linux", "windows")
    for bad in ([], "linux", ["Linux"], ["darwin"], [None]):
        with pytest.raises(ConfigError, match=r"spec\.fallbackOperatingSystems"):
            PlacementConfig.from_object({"spec": {"fallbackOperatingSystems": bad}})

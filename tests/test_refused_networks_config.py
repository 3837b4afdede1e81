"""``spec.imageInspection.refusedNetworks``: parsed into the config, its default is the one
list of :data:`imageinspect.DEFAULT_REFUSED_NETWORKS` (the CRD's default says the same), and
the controller's inspector follows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from podplacement.controller.inspectors import InspectorSource
from podplacement.imageinspect import DEFAULT_REFUSED_NETWORKS, parse_networks
from podplacement.rules.config import ConfigError, PlacementConfig

CRD = Path(__file__).resolve().parents[1] / "deploy" / "crds" / "podplacementconfig.yaml"


def _config(refused: object) -> PlacementConfig:
    return PlacementConfig.from_object({"spec": {"imageInspection": {"refusedNetworks": refused}}})


def test_the_default_refuses_link_local_and_the_clouds_metadata_addresses() -> None:
    nets = [str(n) for n in PlacementConfig().image_inspection.refused_networks]
    assert nets == ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "fd00:ec2::253/128",
                    "fd00:ec2::23/128",
                    "100.100.100.200/32", "168.63.129.16/32"]
    assert PlacementConfig.from_object({"spec": {}}).image_inspection.refused_networks == (
        PlacementConfig().image_inspection.refused_networks)


def test_the_crds_default_is_the_products_default() -> None:
    doc = yaml.safe_load(CRD.read_text())
    field = (doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
             ["properties"]["imageInspection"]["properties"]["refusedNetworks"])
    assert field["default"] == list(DEFAULT_REFUSED_NETWORKS)
    assert field["maxItems"] == 64


def test_a_set_list_replaces_the_default() -> None:
    config = _config(["169.254.0.0/16", "127.0.0.77", "fd00::/8"])
    assert [str(n) for n in config.image_inspection.refused_networks] == [
        "169.254.0.0/16", "127.0.0.77/32", "fd00::/8"]
    assert _config([]).image_inspection.refused_networks == ()


@pytest.mark.parametrize("bad", ["10.0.0.0/8", ["10.0.0.0/8", 7], ["nope"], ["x"] * 65])
def test_a_malformed_list_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="refusedNetworks"):
        _config(bad)


async def test_the_controllers_inspector_follows_the_refused_networks() -> None:
    configs = [_config(["169.254.0.0/16"])]
    source = InspectorSource(None, lambda: (configs[-1], None), lambda: None,
                             registries_conf=None, insecure=(), retries=0, ca_bundles={})
    first = source.current()
    assert source.current() is first
    configs.append(_config(["169.254.0.0/16", "127.0.0.77/32"]))
    second = source.current()
    assert second is not first
    networks = second._transport._networks()
    assert tuple(networks) == parse_networks(["169.254.0.0/16", "127.0.0.77/32"])
    await first.aclose()
    await source.aclose()

"""CRD conversions without an API server: the declaration's checks, hub-and-spoke and pairwise conversion, the
ConversionReview v1 wire format, the server's answers (a failed ``result``, never a 500), the plugin hook, and the
CRD ``spec.conversion`` rules of the managed upkeep."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import orjson
import pytest

from examples.plugins import archive_conversion
from syncer.plugins import PluginError, load_plugins
from syncer.webhook import Conversion
from syncer.webhook.certificates import ServingCertificates
from syncer.webhook.configuration import ConfigurationError
from syncer.webhook.conversion import ConversionError, conversion_response, parse_conversion_review
from syncer.webhook.conversion_configuration import _check_versions
from syncer.webhook.review import ReviewError
from syncer.webhook.server import WebhookServer

from tests.helpers import free_port
from tests.webhook_server import Served

CRD = "things.example.com"


def same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def rename(old: str, new: str) -> Any:
    def convert(obj: dict[str, Any]) -> dict[str, Any]:
        obj["spec"][new] = obj["spec"].pop(old)
        return obj
    return convert


def thing(version: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"example.com/{version}", "kind": "Thing",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u-1"}, "spec": spec}


HUB = Conversion(CRD, hub="v1", spokes={"v2": (rename("b", "a"), rename("a", "b")),
                                         "v3": (rename("c", "a"), rename("a", "c"))})


@pytest.mark.parametrize("kwargs, message", [
    ({"crd": "things"}, "crd must be the CRD's name, '<plural>.<group>'"),
    ({"crd": "things.Example.com"}, "crd must be the CRD's name"),
    ({}, "declare either hub= with spokes= or pairs=, not both nor neither"),
    ({"hub": "v1", "pairs": {("v1", "v2"): same}}, "declare either hub= with spokes= or pairs="),
    ({"hub": "v1"}, "spokes must map at least one version"),
    ({"hub": "V1", "spokes": {"v2": (same, same)}}, "hub must be a version name like 'v1', got 'V1'"),
    ({"hub": "v1", "spokes": {"v1": (same, same)}}, "spoke 'v1' must be a version name other than the hub"),
    ({"hub": "v1", "spokes": {"v2": same}}, r"spokes\['v2'\] must be a tuple \(to_hub, from_hub\)"),
    ({"hub": "v1", "spokes": {"v2": (same, "x")}}, r"spokes\['v2'\]\[1\] \(from_hub\) must be a function"),
    ({"pairs": {("v1", "v1"): same}}, r"pairs keys must be \(from_version, to_version\) of two different"),
    ({"pairs": {"v1": same}}, "pairs keys must be"),
])
def test_declaration_mistakes_are_caught_when_declared(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Conversion(**{"crd": CRD, **kwargs})


async def test_hub_and_spoke_goes_through_the_hub_and_sets_the_api_version() -> None:
    original = thing("v2", b=1)
    v3 = await HUB.convert(original, "v3")
    assert v3 == {**thing("v3", c=1)} and original == thing("v2", b=1), "the input is not changed"
    assert await HUB.convert(v3, "v1") == thing("v1", a=1)
    assert await HUB.convert(thing("v1", a=2), "v2") == thing("v2", b=2)
    same_version = thing("v2", b=3)
    assert await HUB.convert(same_version, "v2") is same_version
    assert (HUB.versions, HUB.strategy, HUB.path, HUB.group) == (["v1", "v2", "v3"], "hub v1", f"/convert/{CRD}",
                                                                 "example.com")


async def test_pairwise_conversion_and_its_failures() -> None:
    async def later(obj: dict[str, Any]) -> dict[str, Any]:
        return rename("a", "b")(obj)

    def broken(obj: dict[str, Any]) -> Any:
        return None

    pairwise = Conversion(CRD, pairs={("v1", "v2"): later, ("v2", "v1"): broken})
    assert await pairwise.convert(thing("v1", a=1), "v2") == thing("v2", b=1)
    assert pairwise.strategy == "pairwise" and pairwise.versions == ["v1", "v2"]
    with pytest.raises(ConversionError, match=r"^things.example.com ns/t: the converter from v2 to v1 returned "
                                              r"NoneType, expected the converted object as a dict$"):
        await pairwise.convert(thing("v2", b=1), "v1")
    with pytest.raises(ConversionError, match=r"^things.example.com ns/t: no converter from v1 to v3 \(declared: "
                                              r"v1 to v2, v2 to v1\)$"):
        await pairwise.convert(thing("v1", a=1), "v3")
    with pytest.raises(ConversionError, match=r"the converter from v2 to v1 raised KeyError: 'b'"):
        await HUB.convert(thing("v2", x=1), "v1")


def test_the_conversion_review_wire_format() -> None:
    body = orjson.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": {
        "uid": "u", "desiredAPIVersion": "example.com/v2", "objects": [thing("v1", a=1)]}})
    request = parse_conversion_review(body)
    assert (request.uid, request.desired_api_version, request.objects) == ("u", "example.com/v2", [thing("v1", a=1)])
    assert orjson.loads(conversion_response("u", [thing("v2", b=1)])) == {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": "u", "convertedObjects": [thing("v2", b=1)], "result": {"status": "Success"}}}
    assert orjson.loads(conversion_response("u", error="no"))["response"] == {
        "uid": "u", "result": {"status": "Failure", "message": "no"}}
    for bad, message in [(b"[", "the body is not JSON"),
                         (b"[]", "expected kind ConversionReview of apiextensions.k8s.io/v1, got a JSON list"),
                         (b'{"apiVersion": "apiextensions.k8s.io/v1beta1", "kind": "ConversionReview"}',
                          "got kind 'ConversionReview' of apiVersion 'apiextensions.k8s.io/v1beta1'"),
                         (b'{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": {}}',
                          "no request with a uid"),
                         (b'{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", '
                          b'"request": {"uid": "u", "desiredAPIVersion": "v2", "objects": []}}',
                          "desiredAPIVersion is 'v2', not 'group/version'"),
                         (b'{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", '
                          b'"request": {"uid": "u", "desiredAPIVersion": "example.com/v2", "objects": [1]}}',
                          "objects are not a list of objects")]:
        with pytest.raises(ReviewError, match=message):
            parse_conversion_review(bad)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    certs = ServingCertificates("", ["127.0.0.1"])
    await certs.load()
    server = WebhookServer("127.0.0.1", free_port(), [], certs, conversions=[HUB])
    await server.start()
    assert certs.ca_bundle is not None
    try:
        yield Served(server, certs.ca_bundle)
    finally:
        await server.stop()
        certs.close()


def review(desired: str, *objects: dict[str, Any]) -> bytes:
    return orjson.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": {
        "uid": "uid-7", "desiredAPIVersion": desired, "objects": list(objects)}})


async def test_the_server_converts_and_answers_failures_as_a_failed_result(served: Served) -> None:
    code, doc = await served.post(HUB.path, review("example.com/v3", thing("v1", a=1), thing("v2", b=2)))
    assert code == 200 and doc["response"] == {"uid": "uid-7", "convertedObjects": [thing("v3", c=1), thing("v3", c=2)],
                                               "result": {"status": "Success"}}
    code, doc = await served.post(HUB.path, review("example.com/v1", thing("v2", x=1)))
    assert code == 200 and doc["response"]["result"] == {"status": "Failure", "message": (
        "things.example.com ns/t: the converter from v2 to v1 raised KeyError: 'b' (request uid uid-7)")}
    code, doc = await served.post(HUB.path, review("other.com/v1", thing("v2", b=1)))
    assert code == 200 and "was asked for other.com/v1, another group" in doc["response"]["result"]["message"]
    code, doc = await served.post(HUB.path, b'{"kind": "AdmissionReview"}')
    assert code == 400 and doc["message"].startswith("not a ConversionReview request: expected kind ConversionReview")
    code, doc = await served.post(HUB.path, b"{}", content_type="text/plain")
    assert code == 415
    stats = served.server.stats[HUB.path].as_dict()
    assert (stats["requests"], stats["allowed"], stats["errors"]) == (5, 1, 4)


def test_the_plugin_hook(tmp_path: Path) -> None:
    plugins = load_plugins(["examples.plugins.archive_conversion"], entry_points=False)
    assert [c.crd for c in plugins.conversions] == [archive_conversion.CRD] and plugins.controllers == {}
    (tmp_path / "bad.py").write_text("def syncer_conversions(settings):\n    return ['x']\n")
    with pytest.raises(PluginError, match=r"syncer_conversions\(\) returned an item that is no use: str is not a "
                                          r"Conversion"):
        load_plugins([str(tmp_path / "bad.py")], entry_points=False)
    (tmp_path / "twice.py").write_text("from examples.plugins import archive_conversion\n"
                                       "def syncer_conversions(settings):\n"
                                       "    return archive_conversion.syncer_conversions(settings)\n")
    with pytest.raises(PluginError, match=r"conversion name 'archives.examples.kube-syncer.io' is defined by both"):
        load_plugins(["examples.plugins.archive_conversion", str(tmp_path / "twice.py")], entry_points=False)


def test_a_served_version_without_a_converter_is_refused_before_the_crd_is_written() -> None:
    crd = {"spec": {"versions": [{"name": "v1", "served": True}, {"name": "v4", "served": True},
                                 {"name": "v0", "served": False}]}}
    with pytest.raises(ConfigurationError, match=r"CRD things.example.com serves version\(s\) v4, which its "
                                                 r"conversion \(hub v1: v1, v2, v3\) does not convert"):
        _check_versions(HUB, crd)

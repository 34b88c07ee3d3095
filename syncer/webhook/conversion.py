"""CRD conversion webhooks: what a plugin declares (``Conversion``), and ConversionReview v1 on the wire.

``syncer_conversions(settings)`` declares per CRD either hub-and-spoke (``hub="v1", spokes={"v2": (to_hub,
from_hub)}``) or pairwise (``pairs={("v1", "v2"): f, ...}``) converters; a converter gets a copy of the object and
returns the other version (``apiVersion`` is set for it; the API server keeps the metadata). Differs from
controller-runtime: objects are dicts, so versions and functions are named directly, and pairs need no hub. As
there, a failed conversion is a 200 ``Failure`` result whose message reaches the client, never a 500. Each CRD is
served at ``/convert/<crd name>``.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import orjson

from .declaration import is_dns_label, is_qualified_name
from .review import ReviewError

Converter = Callable[[dict[str, Any]], dict[str, Any]] | Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
CONVERSION_REVIEW_API_VERSION = "apiextensions.k8s.io/v1"


class ConversionError(Exception):
    """An object that cannot be converted; the message says which object, between which versions, and why."""


@dataclass(frozen=True)
class Conversion:
    """How objects of the CRD ``crd`` (its name, ``<plural>.<group>``, e.g. ``backups.example.com``) convert
    between versions: either ``hub`` with ``spokes`` (version -> ``(to_hub, from_hub)`` converters), or ``pairs``
    (``(from_version, to_version)`` -> converter). Mistakes are ValueError when declared."""

    crd: str
    hub: str = ""
    spokes: Mapping[str, tuple[Converter, Converter]] = field(default_factory=dict)
    pairs: Mapping[tuple[str, str], Converter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        what = f"Conversion {self.crd!r}"
        if not is_qualified_name(self.crd):
            raise ValueError(f"{what}: crd must be the CRD's name, '<plural>.<group>' with a group of at least two "
                             "labels, like 'backups.example.com'")
        if bool(self.hub or self.spokes) == bool(self.pairs):
            raise ValueError(f"{what}: declare either hub= with spokes= or pairs=, not both nor neither")
        if self.pairs:
            for key, converter in self.pairs.items():
                if not (isinstance(key, tuple) and len(key) == 2 and all(map(is_dns_label, key)) and key[0] != key[1]):
                    raise ValueError(f"{what}: pairs keys must be (from_version, to_version) of two different "
                                     f"versions like ('v1', 'v2'), got {key!r}")
                _check_converter(what, f"pairs[{key!r}]", converter)
            return
        if not is_dns_label(self.hub):
            raise ValueError(f"{what}: hub must be a version name like 'v1', got {self.hub!r}")
        if not self.spokes:
            raise ValueError(f"{what}: spokes must map at least one version to (to_hub, from_hub) converters")
        for version, pair in self.spokes.items():
            if not is_dns_label(version) or version == self.hub:
                raise ValueError(f"{what}: spoke {version!r} must be a version name other than the hub {self.hub!r}")
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"{what}: spokes[{version!r}] must be a tuple (to_hub, from_hub), got {pair!r}")
            _check_converter(what, f"spokes[{version!r}][0] (to_hub)", pair[0])
            _check_converter(what, f"spokes[{version!r}][1] (from_hub)", pair[1])

    @property
    def path(self) -> str:
        """The URL path the conversion webhook is served at."""
        return f"/convert/{self.crd}"

    @property
    def group(self) -> str:
        """The CRD's API group."""
        return self.crd.partition(".")[2]

    @property
    def versions(self) -> list[str]:
        """The versions the declaration converts between, sorted."""
        if self.pairs:
            return sorted({v for pair in self.pairs for v in pair})
        return sorted({self.hub, *self.spokes})

    @property
    def strategy(self) -> str:
        """``hub v1`` or ``pairwise``, for ``check-config`` and ``/status``."""
        return f"hub {self.hub}" if self.hub else "pairwise"

    async def convert(self, obj: dict[str, Any], version: str) -> dict[str, Any]:
        """``obj`` converted to ``version`` (``obj`` itself if it is of that version already); ConversionError
        names the object, the versions and the cause (a converter that raised or returned no dict included)."""
        current = str(obj.get("apiVersion", "")).rpartition("/")[2]
        if current == version:
            return obj
        if self.pairs:
            steps = [(current, version)]
        elif current == self.hub or version == self.hub:
            steps = [(current, version)]
        else:
            steps = [(current, self.hub), (self.hub, version)]
        for source, target in steps:
            obj = await self._step(obj, source, target)
        return obj

    async def _step(self, obj: dict[str, Any], source: str, target: str) -> dict[str, Any]:
        name = _object_name(obj)
        converter = self._converter(source, target)
        if converter is None:
            raise ConversionError(f"{self.crd} {name}: no converter from {source} to {target} (declared: "
                                  f"{self._declared()})")
        try:
            returned: Any = converter(copy.deepcopy(obj))
            if inspect.isawaitable(returned):
                returned = await returned
        except Exception as e:
            cause = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise ConversionError(f"{self.crd} {name}: the converter from {source} to {target} raised {cause}") from e
        if not isinstance(returned, dict):
            raise ConversionError(f"{self.crd} {name}: the converter from {source} to {target} returned "
                                  f"{type(returned).__name__}, expected the converted object as a dict")
        return {**returned, "apiVersion": f"{self.group}/{target}"}

    def _converter(self, source: str, target: str) -> Converter | None:
        if self.pairs:
            return self.pairs.get((source, target))
        if target == self.hub and source in self.spokes:
            return self.spokes[source][0]
        if source == self.hub and target in self.spokes:
            return self.spokes[target][1]
        return None

    def _declared(self) -> str:
        if self.pairs:
            return ", ".join(f"{a} to {b}" for a, b in self.pairs)
        return f"hub {self.hub} with spokes {', '.join(self.spokes)}"


@dataclass(frozen=True)
class ConversionRequest:
    """A ConversionReview's request: ``uid``, the ``desired_api_version`` (``group/version``) and ``objects``."""

    uid: str
    desired_api_version: str
    objects: list[dict[str, Any]]


def parse_conversion_review(body: bytes) -> ConversionRequest:
    """The request of a ConversionReview v1 body; ReviewError says what is missing or malformed."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ReviewError(f"the body is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ConversionReview" or \
            doc.get("apiVersion") != CONVERSION_REVIEW_API_VERSION:
        got = (f"kind {doc.get('kind')!r} of apiVersion {doc.get('apiVersion')!r}" if isinstance(doc, dict)
               else f"a JSON {type(doc).__name__}")
        raise ReviewError(f"expected kind ConversionReview of {CONVERSION_REVIEW_API_VERSION}, got {got}")
    req = doc.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise ReviewError("the ConversionReview has no request with a uid")
    desired, objects = req.get("desiredAPIVersion"), req.get("objects")
    if not isinstance(desired, str) or "/" not in desired:
        raise ReviewError(f"the ConversionReview request's desiredAPIVersion is {desired!r}, not 'group/version'")
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise ReviewError("the ConversionReview request's objects are not a list of objects")
    return ConversionRequest(req["uid"], desired, objects)


def conversion_response(uid: str, converted: list[dict[str, Any]] | None = None, error: str = "") -> bytes:
    """The ConversionReview answering request ``uid``: ``converted`` objects, or a ``Failure`` with ``error``."""
    response: dict[str, Any] = {"uid": uid}
    if error:
        response["result"] = {"status": "Failure", "message": error}
    else:
        response["convertedObjects"] = converted or []
        response["result"] = {"status": "Success"}
    return orjson.dumps({"apiVersion": CONVERSION_REVIEW_API_VERSION, "kind": "ConversionReview",
                         "response": response})


def _check_converter(what: str, where: str, converter: Any) -> None:
    if not callable(converter):
        raise ValueError(f"{what}: {where} must be a function obj -> obj, got {type(converter).__name__}")


def _object_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or "(no name)"
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name

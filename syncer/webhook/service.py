"""The sidecar's webhook service: certificates, server, managed configurations and readiness, as one unit.

Ready means the API server can use us (controller-runtime: a TLS dial; kopf: nothing): the self-dial shows the
loaded certificate is served and, with managed configurations, a dry run answered by our probe shows the API server
has picked them up. It runs on every replica; its certificate poll and upkeep tasks (rewriting edited
configurations, carrying out CA changes in three steps) are owned and cancelled by ``withdraw()``, which deletes
what this process wrote on every exit it lives through.
"""

from __future__ import annotations

import asyncio
import ipaddress
import urllib.parse
from typing import Any, Sequence

from loguru import logger

from controllers.health import HealthItem
from informers import ApiClient, ApiError, Backoff, Supervisor, TaskHandle
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error

from ..settings import Webhooks
from .certificates import CertificateError, ServingCertificates
from .configuration import ConfigurationError, ManagedConfigurations
from .conversion import Conversion
from .conversion_configuration import ManagedConversions
from .declaration import Webhook
from .server import WebhookServer, loopback_for

_POLL_CERTIFICATES = 1.0
_UPKEEP_INTERVAL = 30.0
# A converted CRD not installed yet is looked for this often: installed after the sidecar started (as a user
# following the README does), it is configured within seconds rather than at the next round.
_MISSING_CRD_POLL = 2.0
# How long after a configuration write the API server must have called the probes; past it, the upkeep reports
# that it cannot reach us and tries again.
_PROBE_WITHIN = 30.0
_PROBE_EVERY = (0.2, 2.0)  # the first and the longest pause between probes
_REMOVE_WITHIN = 5.0
_UPKEEP_ERRORS = (ApiError, ConfigurationError, CertificateError, *CONNECTION_ERRORS)
_log = logger.bind(component="webhooks")


class NotCalled(Exception):
    """The API server did not call the probes in time."""


class WebhookService:
    """The webhook server of one sidecar process, configured by ``settings`` (``[webhooks]``): admission
    ``webhooks`` and CRD ``conversions``."""

    def __init__(self, settings: Webhooks, webhooks: Sequence[Webhook], client: ApiClient, identity: str,
                 supervisor: Supervisor, conversions: Sequence[Conversion] = ()) -> None:
        self.settings = settings
        self.supervisor = supervisor
        host, _, port = settings.bind.rpartition(":")
        base_url = settings.url or _url(host, int(port))
        manages = _manages(settings.manage_configurations, client.host)
        # With only conversions declared, the configurations hold just the probes: they still prove that the API
        # server reaches us with our CA.
        self.configurations = (ManagedConfigurations(client, settings.configuration_name, identity, base_url,
                                                     webhooks, settings.probe_namespace) if manages else None)
        self.conversions = (ManagedConversions(client, identity, base_url, conversions)
                            if manages and conversions else None)
        # A new CA goes into the configurations' caBundle before its certificate is served (see certificates.py).
        self.certificates = ServingCertificates(settings.cert_dir, settings.hosts, settings.client_ca_file,
                                                stage_ca_changes=self.configurations is not None)
        served = self.configurations.webhooks if self.configurations else list(webhooks)
        self.server = WebhookServer(host, int(port), served, self.certificates, client, conversions)
        self.dialed = False
        self.called = False
        self.last_error = ""
        self._changed = asyncio.Event()
        self._tasks: list[str] = []
        self._withdrawn = False

    @property
    def ready(self) -> bool:
        """The listener serves our certificate and, with managed configurations, the API server called us."""
        return self.dialed and (self.called or self.configurations is None)

    async def start(self) -> None:
        """Load the certificate, listen, and start the upkeep. CertificateError / OSError (address taken) say
        which setting to fix."""
        await self.certificates.load()
        if self.configurations is not None and self.certificates.ca_bundle is None:
            raise CertificateError(f"setting 'webhooks.cert_dir': {self.settings.cert_dir} has no ca.crt, which the "
                                   "managed configurations need as their caBundle; add it (cert-manager's Secrets "
                                   "have it) or set webhooks.manage_configurations = false")
        await self.server.start()
        probes = len(self.configurations.probes) if self.configurations else 0
        _log.info("serving {} admission webhook(s){}{} on https://{} ({} certificate{})",
                  len(self.server.webhooks) - probes,
                  f", {len(self.server.conversions)} CRD conversion(s)" if self.server.conversions else "",
                  " and the readiness probes" if probes else "",
                  self.settings.bind, self.certificates.source,
                  ", client certificates required" if self.server.require_client_cert else "")
        if self.settings.cert_dir:
            self._spawn("webhook certificate reload", self._poll_certificates)
        self._spawn("webhook upkeep", self._upkeep)

    async def stop(self) -> None:
        """Withdraw (see ``withdraw``), then stop serving once the requests in flight are answered."""
        await self.withdraw()
        await self.server.stop()
        self.certificates.close()

    async def withdraw(self) -> None:
        """Stop the upkeep and delete the configurations this process wrote, within a few seconds, while the server
        still answers; again, once done, it does nothing. Every exit of the process that still runs Python calls
        it: a configuration with ``failurePolicy: Fail`` left pointing at a server that is gone makes the API
        server reject every request it matches."""
        if self._withdrawn:
            return
        try:
            async with asyncio.timeout(_REMOVE_WITHIN):
                for name in self._tasks:
                    await self.supervisor.cancel(name)
                self._tasks.clear()
                if self.conversions is not None:
                    for what in await self.conversions.remove():
                        _log.info("removed {}", what)
                if self.configurations is not None:
                    for what in await self.configurations.remove():
                        _log.info("deleted {}", what)
        except _UPKEEP_ERRORS as e:  # TimeoutError included: an unreachable API server must not hold the exit
            _log.warning("could not delete the webhook configurations: {}", _describe(e))
        self._withdrawn = True

    def health(self) -> list[HealthItem]:
        """One item: unhealthy while the upkeep fails (self-dial, configurations, probe)."""
        message = self.last_error or ("ready" if self.ready else "not ready yet")
        return [HealthItem("webhook server", not self.last_error, message)]

    def status(self) -> dict[str, Any]:
        """Readiness, certificate, configurations and the webhooks served, each with its requests, denials, errors
        and latency."""
        return {
            "ready": self.ready, "self_dial": self.dialed, "called_by_api_server": self.called,
            "bind": self.settings.bind, "last_error": self.last_error,
            "certificate": self.certificates.status(),
            "configurations": (f"managed: {self.configurations.name}" if self.configurations else "not managed"),
            "webhooks": [{"name": w.name, "kind": w.kind, "path": w.path, "failure_policy": w.failure_policy,
                          "timeout_seconds": w.timeout_seconds,
                          **({"url": self.configurations.url(w)} if self.configurations else {}),
                          **self.server.stats[w.path].as_dict()}
                         for w in self.server.webhooks],
            "conversions": [self._conversion_status(c) for c in self.server.conversions],
        }

    def _conversion_status(self, conversion: Conversion) -> dict[str, Any]:
        stats = self.server.stats[conversion.path].as_dict()
        stats.pop("denied")
        stats["converted"] = stats.pop("allowed")
        return {"crd": conversion.crd, "strategy": conversion.strategy, "versions": conversion.versions,
                "path": conversion.path,
                **({"url": self.conversions.url(conversion), "configuration": self.conversions.status(conversion)}
                   if self.conversions else {"configuration": "not managed"}),
                **stats}

    # -- tasks -------------------------------------------------------------------------------------------
    def _spawn(self, name: str, body: Any) -> None:
        self.supervisor.spawn(name, body)
        self._tasks.append(name)

    async def _poll_certificates(self, handle: TaskHandle) -> None:
        while True:
            await asyncio.sleep(_POLL_CERTIFICATES)
            if await self.certificates.reload():
                self._changed.set()  # a new CA goes into the configurations at once

    async def _upkeep(self, handle: TaskHandle) -> None:
        backoff = Backoff(initial=0.5, cap=30.0, jitter=0.5)
        while True:
            try:
                await self._check()
            except (*_UPKEEP_ERRORS, NotCalled) as e:
                error = _describe(e)
                if error != self.last_error:
                    _log.warning("webhooks: {}", error)
                self.last_error = error
                handle.failed(e)
                await asyncio.sleep(backoff.next())
                continue
            if self.last_error:
                _log.info("webhooks: recovered from: {}", self.last_error)
            self.last_error = ""
            handle.succeeded()
            backoff.reset()
            missing = self.conversions is not None and self.conversions.missing
            try:
                async with asyncio.timeout(_MISSING_CRD_POLL if missing else _UPKEEP_INTERVAL):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()

    async def _check(self) -> None:
        problem = await self.server.self_dial()
        if problem:
            raise ConnectionError(problem)
        if not self.dialed:
            self.dialed = True
            _log.info("webhook server answers TLS with its certificate")
        if self.configurations is None:
            return
        pending = self.certificates.pending
        bundle = self.certificates.trusted_bundle
        if bundle is None:  # ca.crt removed since the start: keep the configurations as they are
            raise CertificateError(f"setting 'webhooks.cert_dir': {self.settings.cert_dir} no longer has ca.crt")
        for what in await self.configurations.apply(bundle):
            _log.info("webhooks: {}", what)
        if self.conversions is not None:
            for what in await self.conversions.apply(bundle):
                _log.info("webhooks: {}", what)
        if not self.configurations.called:
            await self._probe()
        # The API server calls us with the configurations just written, so it trusts the new CA too: serve its
        # certificate, and go round again to drop the old CA from the caBundle.
        if self.certificates.promote(pending):
            _log.info("webhooks: serving the certificate of the new CA; removing the old CA from the caBundle")
            self._changed.set()

    async def _probe(self) -> None:
        assert self.configurations is not None
        pause, longest = _PROBE_EVERY
        probes = 0
        try:
            async with asyncio.timeout(_PROBE_WITHIN) as deadline:
                while not await self.configurations.probe():
                    probes += 1
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, longest)
        except TimeoutError:
            if not deadline.expired():
                raise  # the request itself timed out: an error of the API connection
            raise NotCalled(f"the API server did not call the probe webhook at "
                            f"{self.configurations.url(self.configurations.probes[0])} within {_PROBE_WITHIN:g}s "
                            f"({probes} dry runs); check that it can reach 'webhooks.url' and that the certificate's "
                            "'webhooks.hosts' name it") from None
        if not self.called:
            _log.info("webhooks ready: the API server called us after {} dry run(s)", probes + 1)
        self.called = True


def _manages(setting: bool | str, api_server: str) -> bool:
    """Whether to manage configurations: as set, or for ``auto``, when the API server is on loopback (a local
    control plane, which can reach us without a Service)."""
    if setting != "auto":
        return bool(setting)
    host = urllib.parse.urlsplit(api_server).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url(host: str, port: int) -> str:
    """The base URL of a listener on ``host:port``, with loopback for a wildcard address."""
    host = loopback_for(host)
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _describe(e: BaseException) -> str:
    """Our own errors say it all; others (API, connection) need their type too."""
    if isinstance(e, (ConfigurationError, NotCalled, CertificateError, ConnectionError)) and str(e):
        return str(e)
    return describe_error(e)

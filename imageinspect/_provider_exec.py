"""Kubelet image credential providers, the I/O part: run the plugins and cache their answers.

:func:`exec_plugin` runs one plugin as the kubelet does (``pkg/credentialprovider/plugin/
plugin.go`` ``ExecPlugin``): ``<binDir>/<name> args...`` with no shell, the controller's
environment plus the provider's ``env``, the ``CredentialProviderRequest`` JSON on stdin, the
``CredentialProviderResponse`` read from stdout. Unlike the kubelet, stdout and stderr are
bounded (:data:`imageinspect._credproviders.MAX_RESPONSE_BYTES`) and the timeout is the
caller's (default 60 s, the kubelet's); a plugin over either is killed by its process group
(the group of the pid started here, ``start_new_session``), never by name.

:class:`ProviderRunner` answers "which credentials do the providers give for this image (for
this pod)": the providers that apply (:func:`imageinspect._credproviders.providers_for`), each
answered from :class:`imageinspect._credproviders.ResponseCache` or by one run (concurrent
asks for one key share the run, as the kubelet's singleflight), ServiceAccount-token mode
through a :class:`ServiceAccountSource` the caller supplies (the controller's TokenRequest).
A failing provider is logged in one line, counted and skipped: the pod is inspected with what
the others (and its pull secrets) give, then anonymously.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from podplacement.imageinspect._credentials import Credential
from podplacement.imageinspect._credproviders import (
    DEFAULT_EXEC_TIMEOUT,
    MAX_RESPONSE_BYTES,
    CredentialProvider,
    ProviderConfigError,
    ProviderResponseError,
    ResponseCache,
    build_request,
    entry_key,
    expiry,
    load_provider_config,
    merge_provider_credentials,
    parse_response,
    providers_for,
    service_account_key,
    token_hash,
)
from podplacement.imageinspect._errors import CredentialError

log = logging.getLogger("podplacement.imageinspect")

#: stderr kept for the log line, bytes.
MAX_STDERR_BYTES = 4096


class PluginError(CredentialError):
    """A plugin run failed (not found, exit status, timeout, output too large, bad answer)."""


async def _read_bounded(stream: asyncio.StreamReader | None, bound: int) -> tuple[bytes, bool]:
    """Up to ``bound`` bytes of ``stream``; the flag says more was there (the caller then
    kills the process, which may be blocked on a full pipe)."""
    if stream is None:
        return b"", False
    out = bytearray()
    over = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(out), over
        room = bound - len(out)
        if len(chunk) > room:
            over = True
            out += chunk[:max(room, 0)]
            return bytes(out), over
        out += chunk


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def exec_plugin(path: str, args: Sequence[str], env: Sequence[tuple[str, str]],
                      stdin: bytes, *, limit_seconds: float = DEFAULT_EXEC_TIMEOUT,
                      max_output: int = MAX_RESPONSE_BYTES) -> bytes:
    """Run ``path args...`` (no shell) with ``stdin``; its stdout.

    The environment is this process's with ``env`` appended (later wins, as the kubelet's
    ``mergeEnvVars``). At most ``max_output`` bytes of stdout and :data:`MAX_STDERR_BYTES` of
    stderr are kept; more stdout, or a run longer than ``limit_seconds``, kills the
    plugin's process group.

    Raises:
        PluginError: it could not start, exited non-zero, timed out or wrote too much (the
            message holds at most 200 characters of its stderr, never its stdout).
    """
    environ = dict(os.environ)
    environ.update(dict(env))
    try:
        proc = await asyncio.create_subprocess_exec(
            path, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=environ, start_new_session=True)
    except OSError as exc:
        raise PluginError(f"cannot run {os.path.basename(path)}: {exc.strerror}") from exc

    async def talk() -> tuple[bytes, bool, bytes]:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.close()
        errors = asyncio.ensure_future(_read_bounded(proc.stderr, MAX_STDERR_BYTES))
        try:
            out, over = await _read_bounded(proc.stdout, max_output)
            if over:
                _kill_group(proc.pid)  # at once: it may be blocked writing more
            err, _ = await errors
        finally:
            errors.cancel()
        await proc.wait()
        return out, over, err

    name = os.path.basename(path)
    try:
        out, over, err = await asyncio.wait_for(talk(), limit_seconds)
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise PluginError(f"{name} did not answer within {limit_seconds:g}s: killed") from None
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    if over:
        raise PluginError(f"{name} wrote more than {max_output} bytes: killed")
    if proc.returncode != 0:
        detail = " ".join(err.decode("utf-8", "replace").split())[:200]
        raise PluginError(f"{name} exited with status {proc.returncode}"
                          + (f": {detail}" if detail else ""))
    return out


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who an image is pulled for (ServiceAccount-token mode).

    Attributes:
        namespace, name, uid: the pod's.
        service_account: ``spec.serviceAccountName`` ("" when none).
    """

    namespace: str
    name: str
    uid: str
    service_account: str


class ServiceAccountSource(Protocol):
    """The API calls of ServiceAccount-token mode (the controller supplies them)."""

    async def account(self, namespace: str, name: str) -> tuple[str, Mapping[str, str]]:
        """The ServiceAccount's uid and annotations (raises when it cannot be read)."""
        ...

    async def token(self, pod: PodIdentity, audience: str) -> str:
        """A token of the pod's ServiceAccount for ``audience``, bound to the pod
        (TokenRequest; raises when refused)."""
        ...


#: ``(path, args, env, stdin, timeout)`` → stdout; :func:`exec_plugin` unless a test swaps it.
Executor = Callable[[str, Sequence[str], Sequence[tuple[str, str]], bytes, float],
                    Awaitable[bytes]]


async def _default_executor(path: str, args: Sequence[str], env: Sequence[tuple[str, str]],
                            stdin: bytes, limit_seconds: float) -> bytes:
    return await exec_plugin(path, args, env, stdin, limit_seconds=limit_seconds)


def check_binaries(providers: Sequence[CredentialProvider], bin_dir: str) -> None:
    """Each provider's executable exists in ``bin_dir`` and may be run (the kubelet refuses
    to start otherwise).

    Raises:
        ProviderConfigError: the directory or an executable is missing.
    """
    if not os.path.isdir(bin_dir):
        raise ProviderConfigError(f"the provider bin directory {bin_dir} does not exist")
    for p in providers:
        path = os.path.join(bin_dir, p.name)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ProviderConfigError(f"provider {p.name}: no executable {path}")


class ProviderRunner:
    """Credentials from the configured providers, cached.

    Args:
        providers: the parsed config (:func:`imageinspect._credproviders.parse_provider_config`).
        bin_dir: the directory holding the executables.
        accounts: ServiceAccount-token mode's API calls; None: providers with
            ``tokenAttributes`` are skipped (logged once).
        timeout: seconds one run may take.
        clock: monotonic seconds (tests).
        executor: runs a plugin (tests).
        on_run: called with (provider name, result) after each run (``ok``, ``error``).

    Attributes:
        runs: plugin runs so far, per provider name.
    """

    def __init__(self, providers: Sequence[CredentialProvider], bin_dir: str, *,
                 accounts: ServiceAccountSource | None = None,
                 timeout: float = DEFAULT_EXEC_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic,
                 executor: Executor = _default_executor,
                 on_run: Callable[[str, str], None] | None = None) -> None:
        self.providers = tuple(providers)
        self.bin_dir = bin_dir
        self.accounts = accounts
        self.timeout = timeout
        self._clock = clock
        self._exec = executor
        self._on_run = on_run
        self._caches = {p.name: ResponseCache() for p in self.providers}
        self._inflight: dict[tuple[str, str, str], asyncio.Future[tuple[Credential, ...]]] = {}
        self.runs: dict[str, int] = {p.name: 0 for p in self.providers}

    @classmethod
    def from_files(cls, config_path: str, bin_dir: str, **kwargs: object) -> ProviderRunner:
        """Read and check the config file and the executables.

        Raises:
            ProviderConfigError: unreadable or invalid config, missing executables.
        """
        try:
            with open(config_path, "rb") as f:
                text = f.read(MAX_RESPONSE_BYTES + 1)
        except OSError as exc:
            raise ProviderConfigError(
                f"cannot read the credential provider config {config_path}: {exc.strerror}"
            ) from exc
        if len(text) > MAX_RESPONSE_BYTES:
            raise ProviderConfigError("the credential provider config is larger than 1 MiB")
        providers = load_provider_config(text)
        check_binaries(providers, bin_dir)
        return cls(providers, bin_dir, **kwargs)  # type: ignore[arg-type]

    def applies(self, repository: str) -> bool:
        """True when a provider's ``matchImages`` matches ``repository``."""
        return bool(providers_for(self.providers, repository))

    async def credentials(self, repository: str,
                          pod: PodIdentity | None = None) -> list[Credential]:
        """The credentials the providers give for ``repository`` (``host[:port]/path``, no
        tag: what the kubelet passes as ``image``), for ``pod`` in token mode; earlier
        providers' keys win. Never raises for a provider's failure (logged, skipped)."""
        answers = []
        for provider in providers_for(self.providers, repository):
            try:
                answers.append(await self._one(provider, repository, pod))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("credential provider %s for %s: %s", provider.name,
                            repository[:200], exc)
        return merge_provider_credentials(answers)

    async def _one(self, provider: CredentialProvider, repository: str,
                   pod: PodIdentity | None) -> tuple[Credential, ...]:
        sa_key, token, annotations = "", "", {}
        attrs = provider.token_attributes
        if attrs is not None:
            account = pod.service_account if pod is not None else ""
            if not account:
                if attrs.require_service_account:
                    return ()
            elif self.accounts is None or pod is None:
                raise PluginError("ServiceAccount-token mode needs the TokenRequest API")
            else:
                uid, all_annotations = await self.accounts.account(pod.namespace, account)
                missing = [k for k in attrs.required_annotation_keys if k not in all_annotations]
                if missing:
                    return ()  # the ServiceAccount did not opt in (kubelet: plugin not run)
                annotations = {k: all_annotations[k] for k in
                               (*attrs.required_annotation_keys, *attrs.optional_annotation_keys)
                               if k in all_annotations}
                sa_key = service_account_key(pod.namespace, account, uid, annotations)
                if attrs.cache_type == "Token":
                    token = await self.accounts.token(pod, attrs.audience)
                    sa_key += token_hash(token)
        cache = self._caches[provider.name]
        hit = cache.get(repository, sa_key, self._clock())
        if hit is not None:
            return hit
        flight = (provider.name, repository, sa_key)
        running = self._inflight.get(flight)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[tuple[Credential, ...]] = \
            asyncio.get_running_loop().create_future()
        self._inflight[flight] = future
        try:
            if attrs is not None and pod is not None and pod.service_account and not token:
                assert self.accounts is not None
                token = await self.accounts.token(pod, attrs.audience)
            result = await self._run(provider, repository, sa_key, token, annotations)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning
            raise
        else:
            future.set_result(result)
            return result
        finally:
            self._inflight.pop(flight, None)

    async def _run(self, provider: CredentialProvider, repository: str, sa_key: str,
                   token: str, annotations: Mapping[str, str]) -> tuple[Credential, ...]:
        request = build_request(provider.api_version, repository, token=token,
                                annotations=annotations)
        self.runs[provider.name] += 1
        try:
            out = await self._exec(os.path.join(self.bin_dir, provider.name), provider.args,
                                   provider.env, request, self.timeout)
            response = parse_response(out, provider.api_version)
        except (PluginError, ProviderResponseError):
            if self._on_run is not None:
                self._on_run(provider.name, "error")
            raise
        if self._on_run is not None:
            self._on_run(provider.name, "ok")
        now = self._clock()
        expires = expiry(response, provider.default_cache_duration, now)
        if expires is not None:
            self._caches[provider.name].put(entry_key(response, repository, sa_key),
                                            response.credentials, expires, now)
        return response.credentials

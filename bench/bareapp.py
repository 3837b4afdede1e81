"""The benchmark's baselines, on the webhook's own process and stack, outside the product.

``bench/webhook.py`` compares ``POST /mutate`` with ``POST /bare`` (reads the body, answers a
constant) and ``POST /bare-validate`` (also checks that the body is JSON: the least /mutate
has to do). :func:`add_baselines` adds those two routes to an app built by
:func:`webhook.app.create_app`; run as a script, this module starts ``podplacement webhook``
(same flags) with them added, so the product's app has no benchmark routes.

Usage: ``python bench/bareapp.py --host 127.0.0.1 --port N --cert-dir D --config-file F``
"""

from __future__ import annotations

import os
import sys

# bench/inspect.py would shadow the standard library's ``inspect``: put the project root
# first on sys.path instead of this script's directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

from typing import Any  # noqa: E402

import msgspec  # noqa: E402
import orjson  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from podplacement.webhook import app as app_module  # noqa: E402
from podplacement.webhook import review  # noqa: E402
from podplacement.webhook.limits import (  # noqa: E402
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    BodyDeadlines,
    BodyRefused,
    read_body,
)

BARE_BODY = orjson.dumps({"apiVersion": review.ADMISSION_V1, "kind": "AdmissionReview",
                          "response": {"uid": "", "allowed": True}})


def add_baselines(app: FastAPI, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  body_timeout: float = DEFAULT_BODY_TIMEOUT) -> FastAPI:
    """Add ``POST /bare`` and ``POST /bare-validate`` to ``app`` (same body limits as
    /mutate); returns ``app``."""
    deadlines = BodyDeadlines()

    @app.post("/bare")
    async def bare(request: Request) -> Response:
        try:
            await read_body(request, max_bytes=max_body_bytes, time_limit=body_timeout,
                            deadlines=deadlines)
        except BodyRefused as exc:
            return review.refused(exc)
        return Response(BARE_BODY, media_type="application/json")

    @app.post("/bare-validate")
    async def bare_validate(request: Request) -> Response:
        # The floor of /mutate: check that the body is JSON (as /mutate must, to answer a
        # malformed one with 400), build nothing, answer the constant.
        try:
            _validate_json(await read_body(
                request, max_bytes=max_body_bytes, time_limit=body_timeout,
                deadlines=deadlines))
        except review.BadReview as exc:
            return review.bad_request(str(exc))
        except BodyRefused as exc:
            return review.refused(exc)
        return Response(BARE_BODY, media_type="application/json")

    return app


class _Nothing(msgspec.Struct):
    """Decodes any JSON object into nothing: a syntax check that builds no object."""


_SYNTAX_CHECK = msgspec.json.Decoder(_Nothing)


def _validate_json(body: bytes) -> None:
    """Raise ``BadReview`` unless ``body`` is a JSON object, without building anything
    (msgspec): the least ``/mutate`` has to do, the floor this benchmark measures."""
    try:
        _SYNTAX_CHECK.decode(body)
    except msgspec.MsgspecError as exc:
        raise review.BadReview(f"body is not a JSON object: {exc}") from None


def create_app_with_baselines(*args: Any, **kwargs: Any) -> FastAPI:
    """:func:`webhook.app.create_app` with :func:`add_baselines`."""
    app = _create_app(*args, **kwargs)
    return add_baselines(
        app, max_body_bytes=kwargs.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
        body_timeout=kwargs.get("body_timeout", DEFAULT_BODY_TIMEOUT))


_create_app = app_module.create_app


def main(argv: list[str]) -> int:
    """``podplacement webhook ARGV`` with the baselines added."""
    from podplacement.cli import main as podplacement_main

    app_module.create_app = create_app_with_baselines  # read by webhook.cli when serving
    return podplacement_main(["--log-level", "warning", "webhook", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

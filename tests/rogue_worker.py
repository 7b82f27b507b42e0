"""A Dask worker that is not one of bbrlab's own, for the engine's security tests.

``python -m tests.rogue_worker MODE SCHEDULER [CA CERT KEY]`` joins the scheduler (over TLS with those files
when given), listening on 127.0.0.1 only, offering the testbed resource, prints ``joined`` and serves until
terminated. MODE:

- ``foreign``: a plain ``distributed.Worker``, without bbrlab's testbed plugin (a ``dask worker --resources
  bbrlab-testbed=1`` someone started by mistake);
- ``standin``: an honest testbed worker with the stand-in run function (a lab's worker without a testbed);
- ``forge``: a worker with the plugin (the stand-in run function of :mod:`tests.engine_runs`) whose task
  lies: every other outcome claims another planned run (status ok), the rest carry a file named
  ``../../../escaped-x`` meant to land beside the campaign directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import bbrlab.campaign.worker as tw
from tests.engine_runs import slow_run

ESCAPE_NAME = "../../../escaped-x"


def _forging(real):
    calls = itertools.count()

    def run_on_worker(attempt, context=None):
        outcome = real(attempt, context)
        if next(calls) % 2 == 0:
            plan = json.loads((Path(context.out) / "plan.json").read_text())
            other = next(r["run_id"] for r in plan["runs"] if r["run_id"] != attempt.run_id)
            return dataclasses.replace(outcome, attempt=dataclasses.replace(outcome.attempt, run_id=other),
                                       status="ok", reason=None, testbed="rogue")
        return dataclasses.replace(outcome, files={**outcome.files, ESCAPE_NAME: b"written by a rogue worker"},
                                   testbed="rogue")

    return run_on_worker


async def serve(mode: str, address: str, files: list[str]) -> None:
    from distributed import Worker
    from distributed.security import Security

    security = None
    if files:
        ca, cert, key = files
        security = Security(require_encryption=True, tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                            tls_worker_cert=cert, tls_worker_key=key)
    plugins = {tw.TestbedPlugin(mode, slow_run)} if mode in ("forge", "standin") else set()
    async with Worker(address, nthreads=1, resources={tw.RESOURCE: 1}, name=f"rogue-{mode}", host="127.0.0.1",
                      protocol=address.split("://", 1)[0], security=security, plugins=plugins,
                      dashboard_address="127.0.0.1:0") as worker:
        print("joined", flush=True)
        await worker.finished()


def main(argv: list[str]) -> int:
    mode, address, *files = argv
    if mode == "forge":
        tw.run_on_worker = _forging(tw.run_on_worker)  # what the driver's task names, looked up here
    asyncio.run(serve(mode, address, files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

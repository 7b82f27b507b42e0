"""The README's bbrlab commands, as a user types them: those ``make test`` runs as written on the suite's testbed
(tests/system/test_testbed_hardening.py) and, for every other one, why not and which test covers it. Checked in the
part of the suite that touches no real system (tests/unit/test_readme_commands.py), so a README edit that adds a
command fails within seconds, not at the end of the real-system part."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Every `bbrlab ...` command the README shows, as a user types it after `bbrlab testbed up`.
README_COMMANDS = [
    "bbrlab cache show",
    "bbrlab doctor",
    "bbrlab doctor --probe-kvm",
    "bbrlab testbed up",
    "bbrlab testbed status",
    "bbrlab testbed shell sender",
    "bbrlab link set --rtt 20ms --rate 50mbit --buffer 1bdp",
    "bbrlab link show",
    "bbrlab link clear",
    "bbrlab contention set --timeslice 1ms --share 25%",
    "bbrlab contention show",
    "bbrlab contention clear",
    "bbrlab kernel build",
    "bbrlab kernel load",
    "bbrlab kernel status",
    "bbrlab kernel ccas",
    "bbrlab campaign run specs/demo.yaml --out runs/demo",
    "bbrlab campaign status runs/demo",
    "bbrlab campaign plan specs/threshold-search-local.yaml",
    "bbrlab campaign schema",
    "bbrlab ingest runs/demo",
]
#: Shown in the README but not run here, and why.
README_NOT_RUN = {
    "bbrlab demo": "make demo itself: the whole method on the local testbed, about 30 minutes, run by hand; its "
                   "steps (calibrate, campaign run, ingest, figures) are README commands run or accounted for here",
    "bbrlab link validate": "20 s of measurement; test_link_testbed runs the command on the same link (20 ms, 50 Mbit/s, "
                            "1 BDP) and checks its tolerances",
    "bbrlab testbed down": "ends the session's testbed (the session fixture brings it down; test_testbed covers down)",
    "bbrlab figures --data runs/demo --out build/figures": "test_figures renders every notebook",
    "bbrlab campaign run SPEC --testbed lab.yaml --out DIR": "a lab's testbed file (placeholders)",
    "bbrlab figures --data DIR": "a placeholder (the figures command above)",
    "bbrlab compare data/demo runs/demo": "needs a second demo recording; tests/unit/analysis/test_compare.py runs the "
                                          "command on data/demo and data/fq-local",
    "bbrlab compare data/demo data/demo-second": "reads the committed data/ only; tests/unit/analysis/test_compare.py "
                                                 "runs it",
    "bbrlab calibrate": "the command's name in the text",
    "bbrlab calibrate specs/demo.yaml --out runs/demo": "5-10 minutes for the demo grid; test_calibrate_testbed "
                                                       "runs the command on a small grid",
    "bbrlab calibrate --show runs/demo": "needs that calibration; test_calibrate_testbed shows one",
    "bbrlab campaign run specs/loss-transfer-local.yaml --out runs/loss": "rsync copies under loss take minutes "
                                                                          "each; test_transfer_testbed runs them",
    "bbrlab kernel build-tree": "a kernel build (about an hour here); test_kernel_tree (slow) runs it",
    "bbrlab kernel build-tree --source DIR --out DIR": "placeholders; see above",
    "bbrlab kernel check KERNEL": "a placeholder; test_sender_kernels checks kernels",
    "bbrlab testbed up [--kernel debian-5.10]": "reboots the session's sender into another kernel; "
                                                "test_sender_kernel_testbed (make test-slow) does",
    "bbrlab campaign run SPEC --out DIR --testbed a --testbed b": "placeholders; test_campaign_two_testbeds (make test-slow) runs "
                                                                  "it on two testbeds of its own",
    "bbrlab tls": "the command's name in the text; test_dask_security runs bbrlab tls ca and cert",
    "bbrlab worker": "the command's name in the text; test_campaign_two_testbeds (make test-slow) starts a TLS scheduler and a "
                     "worker per testbed",
    "bbrlab campaign thresholds DIR [--figure PATH]": "placeholders; test_search_campaign runs it on a search of "
                                                      "its own",
    "bbrlab contention recount": "rebuilds this machine's root domains; test_deadline_accounting runs it after "
                                 "making the kernel's count drift",
    "bbrlab claims check": "reads data/, not the testbed; tests/unit/analysis/test_claims.py runs it",
    "bbrlab hostload data": "reads the committed data/ only; tests/unit/analysis/test_hostload.py runs it",
    "bbrlab check": "the command's name in the text",
    "bbrlab doctor --testbed NAME": "a placeholder; test_timing_env_testbed checks what it shows of the suite's "
                                    "testbed (bbrlab.testbed.doctor.check_timing) against independent reads",
    "bbrlab check DIR [--expect FILE] [--junit PATH]": "placeholders; reads committed data/ only: "
                                                       "tests/unit/analysis/test_expectations.py runs it",
    "bbrlab cache prune [--max-gb N] [--dry-run]": "placeholders; test_cache_prune prunes a cache of its own for "
                                                   "real (this machine's shared image must stay)",
}


def readme_commands() -> set[str]:
    """The bbrlab commands in the README: `bbrlab A B ...` and the verbs listed after it as / `C ARG`."""
    found = set()
    text = (ROOT / "README.md").read_text()
    for line in text.splitlines():
        for m in re.finditer(r"`(bbrlab [^`]+)`((?:\s*/\s*`[^`]+`)*)", line):
            found.add(m.group(1))
            base = " ".join(m.group(1).split()[:2])
            for verb in re.findall(r"`([^`]+)`", m.group(2)):
                found.add(f"{base} {verb}")
    return {c.replace("ROLE", "sender").replace(" / status", "") for c in found}

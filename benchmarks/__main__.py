"""Run every benchmark module (or those named): ``python -m benchmarks [ingest runs testbed_up ...]``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = argv or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"\n=== benchmark: {name} ===", flush=True)
        t0 = time.monotonic()
        try:
            importlib.import_module(f"benchmarks.{name}").main()
        except Exception:  # one broken benchmark must not hide the others' numbers
            traceback.print_exc()
            failed.append(name)
        print(f"--- {name}: {time.monotonic() - t0:.1f} s", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

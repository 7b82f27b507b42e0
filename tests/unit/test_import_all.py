"""Every module imports, and importing a submodule never shadows a package's public function.

(``bbrlab.testbed.status`` once was both a function and a submodule: the first call imported the
submodule, which replaced the function, and the second call failed.)"""

import importlib
import pkgutil

import bbrlab


def _all_modules():
    return [m.name for m in pkgutil.walk_packages(bbrlab.__path__, prefix="bbrlab.")]


def test_every_module_imports_and_public_names_keep_their_kind():
    packages = [bbrlab] + [importlib.import_module(n) for n in _all_modules()
                           if hasattr(importlib.import_module(n), "__path__")]
    before = {(p.__name__, name): callable(getattr(p, name)) for p in packages for name in getattr(p, "__all__", [])}
    for name in _all_modules():
        importlib.import_module(name)
    after = {(p.__name__, name): callable(getattr(p, name)) for p in packages for name in getattr(p, "__all__", [])}
    assert before == after
    assert callable(importlib.import_module("bbrlab.testbed").status)

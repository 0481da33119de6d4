"""Run pytest with ``rlflow._core`` loaded from a sanitizer build (AddressSanitizer and UBSan) instead of the
installed one: ``python tests/core/sanitized_pytest.py CORE_SO [pytest arguments]``, with the sanitizer runtime
preloaded (``LD_PRELOAD``). Used by ``tests/core/test_core_sanitized.py``."""

import importlib.abc
import importlib.machinery
import importlib.util
import sys


class _SanitizedCore(importlib.abc.MetaPathFinder):
    """Finds ``rlflow._core`` at the given path, before every other finder (the editable install's too)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name, path=None, target=None):
        if name != "rlflow._core":
            return None
        return importlib.util.spec_from_file_location(name, self.path,
                                                      loader=importlib.machinery.ExtensionFileLoader(name, self.path))


if __name__ == "__main__":
    sys.meta_path.insert(0, _SanitizedCore(sys.argv[1]))
    import pytest

    from rlflow import _core

    assert _core.__file__ == sys.argv[1], _core.__file__
    sys.exit(pytest.main(sys.argv[2:]))

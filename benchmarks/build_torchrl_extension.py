"""Rebuild TorchRL's C++ extension against the installed torch (needed for TorchRL's prioritized replay).

TorchRL's segment trees live in the compiled module ``torchrl._torchrl``. A TorchRL wheel built against
another torch than the one installed fails to load it (``undefined symbol``), and TorchRL then runs
without prioritized replay. The wheel ships the extension's C++ sources, so this script compiles them
against the installed torch (needs g++ and ninja) and puts the module in place.

    python benchmarks/build_torchrl_extension.py
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
import tempfile


def main() -> None:
    from torch.utils.cpp_extension import load

    spec = importlib.util.find_spec("torchrl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchrl is not installed: pip install -e '.[bench]' first")
    pkg = spec.submodule_search_locations[0]
    ext = load(name="_torchrl", sources=[f"{pkg}/csrc/pybind.cpp", f"{pkg}/csrc/utils.cpp"],
               extra_cflags=["-O3", "-DNDEBUG"], build_directory=tempfile.mkdtemp())
    target = os.path.join(pkg, "_torchrl" + sysconfig.get_config_var("EXT_SUFFIX"))
    shutil.copy(ext.__file__, target + ".new")
    os.replace(target + ".new", target)
    print(f"rebuilt {target}")


if __name__ == "__main__":
    main()

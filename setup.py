"""The build's one dynamic part: the sans-I/O cores compiled with mypyc (see src/progrouter/compiled.py).

``python setup.py build_ext --inplace`` (``make compile``) builds them beside their sources; wheels carry
them. ``PROGROUTER_COMPILE=0`` builds nothing: the package is then plain Python with the same behaviour.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "progrouter"

ext_modules = []
if os.environ.get("PROGROUTER_COMPILE", "1") != "0":
    from mypyc.build import mypycify

    spec = runpy.run_path(str(PACKAGE / "compiled.py"))
    sources = spec["SOURCES"]
    digests = {source: spec["digest"](PACKAGE / source) for source in sources}  # what is compiled
    if "--inplace" in sys.argv:
        # New files, not old ones overwritten: a process that has the old extensions loaded keeps them
        # (rewriting a mapped library under it can crash it), and a failed build leaves plain Python.
        for old in [*PACKAGE.parent.glob("*__mypyc.*"), *(p for s in sources for p in spec["built"](s))]:
            old.unlink()
    ext_modules = mypycify(
        [str((PACKAGE / source).relative_to(ROOT)) for source in sources],
        opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
    )

setup(ext_modules=ext_modules)

if ext_modules and "--inplace" in sys.argv:  # built beside the sources (setup exits on a failed build)
    (PACKAGE / spec["DIGESTS"]).write_text(json.dumps(digests, indent=0, sort_keys=True) + "\n")

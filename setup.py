"""The build's one dynamic part: the sans-I/O cores compiled with mypyc (see src/progrouter/compiled.py).

``python setup.py build_ext --inplace`` (``make compile``) builds them beside their sources; ``pip install``
of a checkout or an sdist, and wheels, carry them. ``PROGROUTER_COMPILE`` chooses: unset, compile when this
machine can build a C extension and otherwise install plain Python with a message saying so; ``1``, compile
or fail; ``0``, build nothing. The plain-Python package has the same behaviour.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "progrouter"
CHOICE = os.environ.get("PROGROUTER_COMPILE", "")


def why_no_extension() -> str | None:
    """Why no C extension can be built here, or None when one can.

    A one-line extension that includes ``Python.h`` is compiled and linked the way ``build_ext`` would (the
    same ``CC``, ``LDSHARED`` and flags), so a missing compiler and missing Python headers are both found
    before mypyc spends its minute type-checking.
    """
    from distutils.ccompiler import new_compiler  # setuptools' copy (setuptools is imported above)
    from distutils.errors import CCompilerError, DistutilsError
    from distutils.sysconfig import customize_compiler, get_python_inc

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text("#include <Python.h>\nint progrouter_probe(void) { return 0; }\n")
        try:
            objects = compiler.compile([str(source)], output_dir=tmp, include_dirs=[get_python_inc()])
            compiler.link_shared_object(objects, str(Path(tmp) / "probe.so"))
        except (CCompilerError, DistutilsError, OSError) as error:
            return str(error)
    return None


class BuildExt(build_ext):
    """Records each compiled module's source digest beside the build (what ``progrouter.compiled`` checks)."""

    def run(self) -> None:
        super().run()
        target = PACKAGE if self.inplace else Path(self.build_lib) / "progrouter"
        (target / spec["DIGESTS"]).write_text(json.dumps(digests, indent=0, sort_keys=True) + "\n")


PLAIN = (
    "installing the plain-Python package, which behaves the same with its cores uncompiled"
    " (PROGROUTER_COMPILE=1 makes this an error)."
)
#: the commands that build extension modules: the others (metadata, sdist) need neither mypyc nor a compiler
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "bdist", "install", "develop"}
building = CHOICE != "0" and bool(BUILDS & set(sys.argv[1:]))
ext_modules = []
problem = why_no_extension() if building and CHOICE != "1" else None
if problem is not None:
    print(
        f"progrouter: no C extension can be built here ({problem}); {PLAIN} To compile the cores, install a"
        " C compiler and the Python headers (gcc, python3-dev) and reinstall.",
        file=sys.stderr,
    )
elif building:
    from mypyc.build import mypycify

    spec = runpy.run_path(str(PACKAGE / "compiled.py"))
    sources = spec["SOURCES"]
    digests = {source: spec["digest"](PACKAGE / source) for source in sources}  # what is compiled
    if "--inplace" in sys.argv:
        # New files, not old ones overwritten: a process that has the old extensions loaded keeps them
        # (rewriting a mapped library under it can crash it), and a failed build leaves plain Python.
        for old in [*PACKAGE.parent.glob("*__mypyc.*"), *(p for s in sources for p in spec["built"](s))]:
            old.unlink()
    try:
        ext_modules = mypycify(
            [str((PACKAGE / source).relative_to(ROOT)) for source in sources],
            opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
        )
    except SystemExit:  # mypyc printed why (a type error under this build's mypy or packages)
        if CHOICE == "1" or "--inplace" in sys.argv:
            raise
        print(f"progrouter: mypyc failed (above); {PLAIN}", file=sys.stderr)

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt} if ext_modules else {})

"""The package's version is the library's, and importing it refuses a
libkvcache of another version (one found first through LD_LIBRARY_PATH)."""

import os
import shutil
import subprocess
import sys

import pytest

import kvcache
from kvcache import _version


def test_version_is_the_library_s():
    assert kvcache.__version__ == _version.__version__ == kvcache.version()
    major, minor, patch = (int(x) for x in kvcache.__version__.split("."))
    assert kvcache.version() == "%d.%d.%d" % (major, minor, patch)


def test_import_refuses_another_library_version(tmp_path):
    # A copy of the package that says it was built with another version: the
    # library it loads (the same as this one) then differs from it.
    pkg = tmp_path / "kvcache"
    shutil.copytree(os.path.dirname(kvcache.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "_version.py").write_text('__version__ = "0.0.1"\n')
    out = subprocess.run([sys.executable, "-c", "import kvcache"], capture_output=True, text=True,
                         cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kvcache 0.0.1 was built with libkvcache 0.0.1, but the process loaded "
                           "libkvcache %s (" % kvcache.version()), out.stderr
    assert "libkvcache." in last and "unset LD_LIBRARY_PATH or reinstall kvcache" in last, out.stderr


def test_import_names_a_library_without_the_functions(tmp_path):
    # A libkvcache.so.0 that exports nothing, found first through
    # LD_LIBRARY_PATH (as an older build's would be): the loader fails, and
    # the ImportError says which library and what to do.
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libkvcache")
    top = os.path.dirname(os.path.dirname(os.path.abspath(kvcache.__file__)))  # holds this kvcache
    (tmp_path / "empty.c").write_text("int kvcache_stand_in;\n")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libkvcache.so.0", "-o", str(tmp_path / "libkvcache.so.0"),
                    str(tmp_path / "empty.c")], check=True)
    out = subprocess.run([sys.executable, "-c", "import kvcache"], capture_output=True, text=True,
                         cwd=str(tmp_path), env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), PYTHONPATH=top))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kvcache %s: its extension could not be loaded with the libkvcache found ("
                           % kvcache.__version__), out.stderr
    assert "undefined symbol: kvc_" in last and last.endswith(
        ", with LD_LIBRARY_PATH=%s; unset LD_LIBRARY_PATH or reinstall kvcache" % tmp_path), out.stderr

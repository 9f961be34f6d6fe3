"""Builds the SWIG extension kvcache._native against an installed libkvcache.

The library is found with pkg-config (`pkg-config kvcache`; set
PKG_CONFIG_PATH for a library installed under a custom prefix, or to the
build tree's bindings/pkgconfig folder). swig (4.0 or newer) generates the
wrapper from bindings/swig/python/kvcache_python.i at build time.
"""

import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
INTERFACE = os.path.join(HERE, "..", "swig", "python", "kvcache_python.i")


def pkg_config(*args):
    try:
        out = subprocess.check_output(["pkg-config", *args, "kvcache"], text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("kvcache: `pkg-config %s kvcache` failed (%s); install libkvcache or set "
                         "PKG_CONFIG_PATH to the folder of its kvcache.pc" % (" ".join(args), e))
    return out.split()


class SwigBuildExt(build_ext):
    """Runs swig into the build folder, then compiles its wrapper."""

    def run(self):
        swig = shutil.which("swig4.0") or shutil.which("swig")
        if swig is None:
            raise SystemExit("kvcache: swig not found (Debian: apt install swig)")
        includes = [f[2:] for f in pkg_config("--cflags-only-I")]
        libdirs = [f[2:] for f in pkg_config("--libs-only-L")]
        os.makedirs(self.build_temp, exist_ok=True)
        wrap = os.path.join(self.build_temp, "native_wrap.cxx")
        pkg_out = os.path.join(self.build_lib if not self.inplace else HERE, "kvcache")
        os.makedirs(pkg_out, exist_ok=True)
        subprocess.check_call([swig, "-c++", "-python", "-threads", *["-I" + d for d in includes],
                               "-o", wrap, "-outdir", pkg_out, INTERFACE])
        for ext in self.extensions:
            ext.sources = [wrap]
            ext.include_dirs += includes
            ext.library_dirs += libdirs
            ext.runtime_library_dirs += libdirs
        super().run()


setup(
    ext_modules=[Extension("kvcache._native", sources=[], libraries=["kvcache"], language="c++",
                           extra_compile_args=["-std=c++17", "-Wno-unused-parameter"])],
    cmdclass={"build_ext": SwigBuildExt},
)

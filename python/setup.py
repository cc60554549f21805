"""setup.py - the build step of the lmk Python package: builds liblmk.so with the repository's own CMake build
(the repository root is ../ of this directory) and ships the library inside the package, where lmk/_lib.py
loads it by absolute path; then the compiled host path, the extension module lmk._host (lmk/_host.c, with
Python's headers and ../include/lmk.h; it does not link liblmk), if it builds: without a C compiler or
Python's headers the package keeps the ctypes path alone, and says so here. pyproject.toml holds the metadata.

Build environment: LMK_CUDA (ON, OFF or AUTO: with CUDA when nvcc is found; default AUTO), CMAKE_ARGS (extra
flags for the configure step), CMAKE_BUILD_PARALLEL_LEVEL (jobs; default: every core).
"""
import os
import re
import shlex
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CMAKELISTS = os.path.join(ROOT, "CMakeLists.txt")


def _version():
    """The project's version: the LMK_VERSION_MAJOR/MINOR/PATCH macros of include/lmk.h, its one source."""
    header = os.path.join(ROOT, "include", "lmk.h")
    with open(header) as f:
        text = f.read()
    parts = [re.search(r"^#define LMK_VERSION_%s\s+(\d+)\s*$" % p, text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise RuntimeError("lmk: %s has no LMK_VERSION_MAJOR/MINOR/PATCH macros" % header)
    return ".".join(m.group(1) for m in parts)


def build_liblmk(build_dir):
    """Configures and builds the shared library in build_dir; returns the real path of liblmk.so."""
    if not os.path.isfile(CMAKELISTS):
        raise RuntimeError("lmk: %s not found: the package builds liblmk.so from the lmk repository, so install "
                           "it from a checkout (pip install ./python at the repository root)" % CMAKELISTS)
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("lmk: building liblmk.so needs CMake >= 3.18 and a C compiler (apt-get install cmake "
                           "gcc, or pip install cmake)")
    configure = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DLMK_CUDA=" + os.environ.get("LMK_CUDA", "AUTO"), "-DLMK_BUILD_TESTS=OFF"]
    configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    build = [cmake, "--build", build_dir, "--target", "lmk_shared"]
    if not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        build += ["-j", str(os.cpu_count() or 2)]
    for cmd in (configure, build):
        print("lmk: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        subprocess.check_call(cmd)
    lib = os.path.join(build_dir, "liblmk.so")
    if not os.path.exists(lib):
        raise RuntimeError("lmk: the build finished but %s does not exist" % lib)
    return os.path.realpath(lib)


class BuildPyWithLibrary(build_py):
    """build_py, then liblmk.so into the built package (and into the source tree for editable installs)."""

    def run(self):
        super().run()
        build_temp = self.get_finalized_command("build").build_temp
        lib = build_liblmk(os.path.join(os.path.abspath(build_temp), "cmake"))
        targets = [os.path.join(self.build_lib, "lmk")]
        if getattr(self, "editable_mode", False):
            targets.append(os.path.join(HERE, "lmk"))
        for d in targets:
            os.makedirs(d, exist_ok=True)
            shutil.copyfile(lib, os.path.join(d, "liblmk.so"))


class OptionalBuildExt(build_ext):
    """build_ext whose failure leaves the package on its ctypes path instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - no compiler: distutils raises several kinds
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001 - a compile or link error
            self._skip(e)

    @staticmethod
    def _skip(e):
        print("lmk: WARNING: the compiled host path (lmk/_host.c) did not build (%s); lmk runs its ops through "
              "ctypes, with more host time per call" % e, flush=True)


HOST_EXTENSION = Extension("lmk._host", sources=["lmk/_host.c"], include_dirs=[os.path.join(ROOT, "include")],
                           extra_compile_args=["-std=c11", "-O2"])


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(version=_version(), ext_modules=[HOST_EXTENSION],
      cmdclass={"build_py": BuildPyWithLibrary, "build_ext": OptionalBuildExt}, distclass=BinaryDistribution)

"""Direct oneDNN convolutions: primitives created once, executed through a C ABI (dnnl_conv.cpp).

In: where oneDNN is installed (the `onednn-cpu-gomp` / `onednn-devel-cpu-gomp` wheels put libdnnl.so.3
under sys.prefix/lib and its headers under sys.prefix/include), the cache and compiler config to build
the glue library with. Out: `load_glue(...)`, the loaded glue (or None, with `unavailable_reason()`
saying why once in the log), and `ConvPrimitive`, one created convolution whose `execute` takes raw
buffer addresses. runtime/library.py's "dnnl" route holds these in its fold cache.

Why: ATen's `_convolution_pointwise` creates oneDNN's primitive descriptor on every call (~20-25 us on
the development VM, a depthwise 384x14x14 conv itself executes in ~10 us); MobileNetV2 runs 52 convs.
Here the descriptor, the primitive, the reordered weights and the scratchpad exist once per handle.

OpenMP: the wheel's libdnnl is built against GNU OpenMP (libgomp.so.1). torch ships its own
libgomp.so.1 and loads it first; the dynamic loader then binds libdnnl's libgomp.so.1 to the already
loaded object of that soname, so oneDNN and torch share one thread pool (`openmp_runtimes` checks it).

The glue's cache key holds its source, the oneDNN version (in the source's first line) and the include
and library paths (in the flags), and build.py adds the compiler and the CPU features.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from autofusion.cache import Cache
from autofusion.codegen.cpp.build import DEFAULT_FLAGS, BuiltLibrary, CompilerConfig, build, load
from autofusion.errors import BuildError

log = logging.getLogger("autofusion.codegen")

SOURCE_PATH = Path(__file__).with_name("dnnl_conv.cpp")
# Activation names (runtime/library.py's `act` literals) -> (code in dnnl_conv.cpp, alpha, beta).
ACTIVATIONS: dict[str, tuple[int, float, float]] = {
    "none": (0, 0.0, 0.0),
    "relu": (1, 0.0, 0.0),
    "relu6": (2, 0.0, 6.0),
    "silu": (3, 1.0, 0.0),
    "sigmoid": (4, 0.0, 0.0),
    "gelu": (5, 0.0, 0.0),
    "gelu_tanh": (6, 0.0, 0.0),
    "hardswish": (7, 1.0 / 6.0, 0.5),
}
DTYPES = {"float32": 0, "bfloat16": 1}
_ERR_LEN = 512


@dataclass(frozen=True)
class Install:
    """A oneDNN installation: its headers' and libdnnl's directories and its version."""

    include: Path
    lib: Path
    version: str


def find_install(prefix: str | Path | None = None) -> Install | str:
    """oneDNN under `prefix` (default sys.prefix), or the reason it is not usable there."""
    root = Path(prefix if prefix is not None else sys.prefix)
    inc, lib = root / "include", root / "lib"
    header = inc / "oneapi" / "dnnl" / "dnnl_version.h"
    if not (lib / "libdnnl.so.3").is_file() and not (lib / "libdnnl.so").is_file():
        return f"no libdnnl.so under {lib} (pip install onednn-cpu-gomp)"
    if not header.is_file() or not (inc / "oneapi" / "dnnl" / "dnnl.hpp").is_file():
        return f"no oneDNN headers under {inc} (pip install onednn-devel-cpu-gomp)"
    parts = {}
    for line in header.read_text(errors="replace").splitlines():
        bits = line.split()
        if len(bits) == 3 and bits[0] == "#define" and bits[1].startswith("DNNL_VERSION_"):
            parts[bits[1][len("DNNL_VERSION_") :]] = bits[2]
    version = ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    if parts.get("MAJOR") != "3":
        return f"oneDNN {version} under {root}: the glue is written for the v3 API"
    return Install(inc, lib, version)


class Glue:
    """The loaded glue library with its functions' signatures declared."""

    def __init__(self, cdll: ctypes.CDLL, install: Install) -> None:
        self.cdll = cdll
        self.install = install
        vp, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float
        cdll.af_dnnl_conv_create.restype = vp
        cdll.af_dnnl_conv_create.argtypes = [i32, vp, vp, vp, vp, i32, f32, f32, i32, ctypes.c_char_p, i64]
        cdll.af_dnnl_conv_execute.restype = i32
        cdll.af_dnnl_conv_execute.argtypes = [vp, vp, vp, vp, ctypes.c_char_p, i64]
        cdll.af_dnnl_conv_destroy.restype = None
        cdll.af_dnnl_conv_destroy.argtypes = [vp]
        cdll.af_dnnl_conv_impl.restype = ctypes.c_char_p
        cdll.af_dnnl_conv_impl.argtypes = [vp]
        cdll.af_dnnl_version.restype = None
        cdll.af_dnnl_version.argtypes = [vp]
        v = (ctypes.c_int32 * 3)()
        cdll.af_dnnl_version(v)
        self.runtime_version = f"{v[0]}.{v[1]}.{v[2]}"
        self.execute = cdll.af_dnnl_conv_execute  # looked up once: the per-call path


_lock = threading.Lock()
_loaded: dict[tuple[str, str], Glue | str] = {}


def load_glue(cache: Cache | str, cxx: str = "g++", prefix: str | Path | None = None) -> Glue | None:
    """The glue, built (cached) and loaded once per process, cache and prefix; None when oneDNN, its
    headers or the compiler are missing or fail (the reason logged once, `unavailable_reason`)."""
    key = (str(prefix if prefix is not None else sys.prefix), cxx)
    with _lock:
        got = _loaded.get(key)
        if got is None:
            got = _load(cache, cxx, prefix)
            _loaded[key] = got
            if isinstance(got, str):
                log.warning("dnnl convolution route unavailable: %s", got)
    return got if isinstance(got, Glue) else None


def unavailable_reason(prefix: str | Path | None = None, cxx: str = "g++") -> str | None:
    """Why `load_glue` returned None for this prefix (None: it loaded, or was not asked yet)."""
    got = _loaded.get((str(prefix if prefix is not None else sys.prefix), cxx))
    return got if isinstance(got, str) else None


def _load(cache: Cache | str, cxx: str, prefix: str | Path | None) -> Glue | str:
    inst = find_install(prefix)
    if isinstance(inst, str):
        return inst
    source = f"// oneDNN {inst.version}\n" + SOURCE_PATH.read_text()
    flags = (*DEFAULT_FLAGS, f"-I{inst.include}", f"-L{inst.lib}", f"-Wl,-rpath,{inst.lib}", "-ldnnl")
    try:
        built = build(source, CompilerConfig(cxx=cxx, flags=flags, timeout_s=300.0), cache, name="dnnl_conv")
        return Glue(load(built), inst)
    except (BuildError, OSError, AttributeError) as e:
        return f"building or loading the oneDNN glue failed: {str(e).splitlines()[0]}"


def loaded() -> Glue | None:
    """The glue this process loaded (for `autofusion.save` to carry it), or None."""
    with _lock:
        return next((g for g in _loaded.values() if isinstance(g, Glue)), None)


def adopt(built: BuiltLibrary, inst: Install, cxx: str, prefix: str | Path | None = None) -> Glue | None:
    """Take `built`, a glue library a saved package installed into the cache (built elsewhere against
    the oneDNN `inst` describes), as this process's glue for `prefix` and `cxx`: no compiler runs. A
    glue already loaded for them is kept. None, with the reason logged, when the library does not load
    here (its libdnnl is not where it was, say) or libdnnl is another version: the route then is
    unavailable, as without the glue."""
    key = (str(prefix if prefix is not None else sys.prefix), cxx)
    with _lock:
        got = _loaded.get(key)
        if isinstance(got, Glue):
            return got
        why: str | None = None
        try:
            glue = Glue(load(built), inst)
        except (BuildError, OSError, AttributeError) as e:
            why = f"the package's oneDNN glue does not load here: {str(e).splitlines()[0]}"
        else:
            if glue.runtime_version != inst.version:
                why = (f"the package's oneDNN glue was built for oneDNN {inst.version}; libdnnl here is "
                       f"{glue.runtime_version}")  # fmt: skip
        if why is not None:
            _loaded[key] = why
            log.warning("dnnl convolution route unavailable: %s", why)
            return None
        _loaded[key] = glue
        return glue


def forget() -> None:
    """Drop the per-process record of loaded and unavailable glue (tests that hide oneDNN)."""
    with _lock:
        _loaded.clear()


class DnnlError(RuntimeError):
    """oneDNN refused to create or run a convolution."""


class ConvPrimitive:
    """One oneDNN convolution: NHWC [n, c, h, w] -> NHWC [n, k, oh, ow], weights reordered at creation.

    `padding` is (top, left, bottom, right); `dilation` 1 is none. The weight buffer (torch's
    contiguous [k, c/groups, kh, kw] layout, `dtype`) and the float32 bias are read only here."""

    def __init__(self, glue: Glue, dtype: str, n: int, c: int, h: int, w: int, k: int, kh: int, kw: int,
                 stride: tuple[int, int], padding: tuple[int, int, int, int], dilation: tuple[int, int],
                 groups: int, weight_ptr: int, bias_ptr: int | None, act: str,
                 residual: bool) -> None:  # fmt: skip
        if dtype not in DTYPES:
            raise DnnlError(f"dtype {dtype} is not a oneDNN convolution type here")
        if act not in ACTIVATIONS:
            raise DnnlError(f"activation {act!r} has no oneDNN post-op here")
        code, alpha, beta = ACTIVATIONS[act]
        dims = (ctypes.c_int64 * 7)(n, c, h, w, k, kh, kw)
        conv = (ctypes.c_int64 * 9)(*stride, *padding, *dilation, groups)
        err = ctypes.create_string_buffer(_ERR_LEN)
        self._destroy = glue.cdll.af_dnnl_conv_destroy
        self.handle = glue.cdll.af_dnnl_conv_create(
            DTYPES[dtype], dims, conv, weight_ptr, bias_ptr, code, alpha, beta, int(residual), err, _ERR_LEN
        )
        if not self.handle:
            raise DnnlError(err.value.decode(errors="replace") or "oneDNN declined the convolution")
        self.impl = glue.cdll.af_dnnl_conv_impl(self.handle).decode(errors="replace")
        self.oh = (h + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        self.ow = (w + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        self.residual = residual
        self._execute = glue.execute
        self._err = err

    def execute(self, src: int, dst: int, residual: int | None = None) -> None:
        """Run on NHWC buffers at these addresses (the residual's only when created with one)."""
        if (residual is not None) != self.residual:
            raise DnnlError("residual given to a convolution created without one, or missing")
        if self._execute(self.handle, src, dst, residual, self._err, _ERR_LEN):
            raise DnnlError(self._err.value.decode(errors="replace"))

    def __del__(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._destroy(handle)


def openmp_runtimes() -> list[str]:
    """The OpenMP runtime files mapped into this process (/proc/self/maps): one when torch's and
    oneDNN's share a pool."""
    found: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                name = Path(path).name
                if name.startswith(("libgomp", "libiomp", "libomp")):
                    found.add(path)
    except OSError:
        pass
    return sorted(found)

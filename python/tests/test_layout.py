"""test_layout.py - the package's copies of include/lmk.h checked against the header itself, so that a change to
lmk.h cannot leave them silently out of step.

The package repeats what lmk.h says in three places: the ctypes structs and constants of _lib.py (struct
layouts, dtype, backend and activation values, status names, flags), the keyword tables of _ops.py (rope modes,
pairings, head layouts, activations) and the keyword tables of the compiled host path, python/lmk/_host.c (which
includes lmk.h, so its structs are the header's, but spells its keyword values in its own tables). One C program
compiled against lmk.h with the system's C compiler prints what the header says of each (sizeof and offsetof of
every field of every ctypes struct, and the field's size and kind; every enumerator of every enum of lmk.h; each
value of _host.c's tables as written there), and the tests compare. Nothing is listed by hand on the C side: the
structs are found in _lib.py (each class's docstring opens with its C name), the enums and their enumerators in
lmk.h, the tables in _host.c, so a struct, field, enum or table added on either side is checked too or fails
here. Without a C compiler these tests skip, saying so; the checks of the loaded library's own answers
(lmk_status_name, lmk_dtype_size) need none.
"""
import ctypes
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from lmk import _lib, _ops

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "lmk.h"
HOST_C = ROOT / "python" / "lmk" / "_host.c"

# Each enum of lmk.h, with the Python tables that copy it: {enumerator: value} as the package has it.
# Names are the header's minus the prefix; keyword spellings are lower case.
ENUM_PREFIX = {"lmk_status": "LMK_", "lmk_dtype": "LMK_", "lmk_backend": "LMK_BACKEND_", "lmk_rope_mode": "LMK_ROPE_",
               "lmk_rope_pairing": "LMK_ROPE_PAIR_", "lmk_repeat_layout": "LMK_REPEAT_", "lmk_activation": "LMK_ACT_"}
# The keyword tables: _ops.py's name, _host.c's name, and the enum they spell.
KEYWORD_TABLES = {"lmk_rope_mode": ("_MODES", "MODES"), "lmk_rope_pairing": ("_PAIRINGS", "PAIRINGS"),
                  "lmk_repeat_layout": ("_LAYOUTS", "LAYOUTS"), "lmk_activation": ("_ACTIVATIONS", "ACTIVATIONS")}
# Macros of lmk.h the package copies, and its copy.
MACROS = {"LMK_GDN_NO_L2NORM": lambda: _lib.GDN_NO_L2NORM, "LMK_DTYPE_COUNT": lambda: len(_lib.DTYPE_SIZES)}


def _strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def header_enums():
    """{enum name: [enumerator, ...]} of every `typedef enum name { ... } name;` in lmk.h."""
    text = _strip_comments(HEADER.read_text())
    enums = {}
    for name, body in re.findall(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", text, re.S):
        enums[name] = [item.split("=")[0].strip() for item in body.split(",") if item.strip()]
    return enums


def host_tables():
    """{table name: [(keyword, C expression), ...]} of every `static const choice NAME[]` in _host.c."""
    text = _strip_comments(HOST_C.read_text())
    tables = {}
    for name, body in re.findall(r"static\s+const\s+choice\s+(\w+)\s*\[\s*\]\s*=\s*\{(.*?)\};", text, re.S):
        tables[name] = re.findall(r"\{\s*\"(\w+)\"\s*,\s*([^}]+?)\s*\}", body)
    return tables


def ctypes_structs():
    """{C struct name: ctypes class} of every ctypes.Structure of _lib.py, named by its docstring's first word."""
    found = {}
    for attr, cls in vars(_lib).items():
        if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls.__module__ == _lib.__name__:
            m = re.match(r"\s*(lmk_\w+)", cls.__doc__ or "")
            assert m, "_lib.%s: its docstring must open with the lmk.h struct it mirrors" % attr
            found[m.group(1)] = cls
    return found


def _kind(ctype):
    """How a field is read: "f" floating, "i" integer (enums included), "p" pointer, None for nested structs
    and arrays (their size and offset are compared, not a kind)."""
    if issubclass(ctype, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        return None
    if ctype in (ctypes.c_float, ctypes.c_double, ctypes.c_longdouble):
        return "f"
    if ctype in (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p) or issubclass(ctype, ctypes._Pointer):
        return "p"
    return "i"


# The same kinds in C: a floating type, an integer type (an enum is compatible with one), or else a pointer.
# Arrays and structs are not asked. Unevaluated, so the null base is never dereferenced.
C_KIND = ('#define KIND(e) _Generic((e), float: "f", double: "f", long double: "f", _Bool: "i", char: "i", '
          'signed char: "i", unsigned char: "i", short: "i", unsigned short: "i", int: "i", unsigned int: "i", '
          'long: "i", unsigned long: "i", long long: "i", unsigned long long: "i", default: "p")')


def _program(structs, enums, tables):
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "lmk.h"', C_KIND, "int main(void)", "{"]
    for cname, cls in structs.items():
        lines.append('    printf("%s size %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, ctype in cls._fields_:
            member = "((%s *)0)->%s" % (cname, field)
            lines.append('    printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(%s));'
                         % (cname, field, cname, field, member))
            if _kind(ctype):
                lines.append('    printf("%s.%s kind %%s\\n", KIND(%s));' % (cname, field, member))
    names = [e for items in enums.values() for e in items] + list(MACROS)
    names += sorted({expr for rows in tables.values() for _, expr in rows})
    for i, expr in enumerate(names):
        lines.append('    printf("value%d %%lld\\n", (long long)(%s));' % (i, expr))
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n", names


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory):
    """What lmk.h says: {"<struct> size": n, "<struct>.<field>": (offset, size), "<struct>.<field> kind": k,
    and each enumerator, macro and _host.c table value (as written) to its value}."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not shutil.which(cc.split()[0]):
        pytest.skip("no C compiler (cc, or $CC): the package's copies of lmk.h are not checked against it")
    if not HEADER.is_file() or not HOST_C.is_file():
        pytest.skip("no include/lmk.h or python/lmk/_host.c next to the tests (an installed package?)")
    src, names = _program(ctypes_structs(), header_enums(), host_tables())
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "layout.c").write_text(src)
    build = subprocess.run(cc.split() + ["-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent),
                                         str(tmp / "layout.c"), "-o", str(tmp / "layout")],
                           capture_output=True, text=True)
    assert build.returncode == 0, ("a struct or field of _lib.py, or a value of _host.c's tables, is not lmk.h's "
                                   "(the program is %s):\n%s" % (tmp / "layout.c", build.stderr))
    out = subprocess.run([str(tmp / "layout")], capture_output=True, text=True, check=True).stdout
    facts = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        words = rest.split()
        if words[0] == "size":
            facts[key + " size"] = int(words[1])
        elif words[0] == "kind":
            facts[key + " kind"] = words[1]
        elif key.startswith("value"):
            facts[names[int(key[5:])]] = int(words[0])
        else:
            facts[key] = (int(words[0]), int(words[1]))
    return facts


def test_structs_are_lmk_h_layouts(c_facts):
    """Every ctypes struct: lmk.h's size, and each field at lmk.h's offset with its size and kind, so a field
    added, removed, reordered, widened or changed between integer, float and pointer shows."""
    structs = ctypes_structs()
    assert structs, "_lib.py declares no ctypes struct"
    for cname, cls in structs.items():
        assert ctypes.sizeof(cls) == c_facts[cname + " size"], \
            "%s: ctypes %s is %d bytes, lmk.h's %d (a field added or removed?)" % (
                cname, cls.__name__, ctypes.sizeof(cls), c_facts[cname + " size"])
        for field, ctype in cls._fields_:
            key = "%s.%s" % (cname, field)
            got = (getattr(cls, field).offset, ctypes.sizeof(ctype))
            assert got == c_facts[key], "%s: ctypes (offset, size) %s, lmk.h %s" % (key, got, c_facts[key])
            if _kind(ctype):
                assert _kind(ctype) == c_facts[key + " kind"], "%s: ctypes kind %s, lmk.h %s" % (
                    key, _kind(ctype), c_facts[key + " kind"])


def _package_enum(enum, items):
    """{enumerator: value} as the package has enum `enum` of enumerators `items`: its status names, the
    constants of _lib.py (LMK_F32 as _lib.F32, LMK_BACKEND_CPU as _lib.BACKEND_CPU; None where missing), or
    the keyword table of _ops.py that spells it."""
    if enum == "lmk_status":
        return {name: value for value, name in _lib.STATUS_NAMES.items()}
    if enum in KEYWORD_TABLES:
        return {ENUM_PREFIX[enum] + k.upper(): v for k, v in getattr(_ops, KEYWORD_TABLES[enum][0]).items()}
    return {e: getattr(_lib, e[len("LMK_"):], None) for e in items}


def test_every_enum_of_lmk_h_is_the_packages(c_facts):
    """Each enum of lmk.h has exactly the enumerators and values of the package's copy (a new enum in lmk.h
    must be given one here)."""
    enums = header_enums()
    assert set(enums) == set(ENUM_PREFIX), "enums of lmk.h %s, mirrored here %s" % (sorted(enums), sorted(ENUM_PREFIX))
    for enum, items in enums.items():
        want = {e: c_facts[e] for e in items}
        got = _package_enum(enum, items)
        assert got == want, "%s: the package has %s, lmk.h %s" % (enum, got, want)


def test_named_constants_and_macros(c_facts):
    assert _lib.OK == c_facts["LMK_OK"] and _lib.UNSUPPORTED == c_facts["LMK_ERR_UNSUPPORTED"]
    assert set(_lib.DTYPE_SIZES) == {c_facts[e] for e in header_enums()["lmk_dtype"]}
    for macro, copy in MACROS.items():
        assert copy() == c_facts[macro], "%s: lmk.h %d, the package %d" % (macro, c_facts[macro], copy())
    multi = {c_facts["LMK_ROPE_" + m] for m in ("MROPE", "IMROPE", "VISION")}
    assert set(_ops._MULTI) == multi, "_ops._MULTI %s: the modes that take sections are %s" % (_ops._MULTI, multi)


def test_host_c_keyword_tables(c_facts):
    """_host.c's keyword tables spell the same keywords as _ops.py's, with lmk.h's values."""
    tables = host_tables()
    assert set(tables) == {host for _, host in KEYWORD_TABLES.values()}, \
        "_host.c's tables %s; checked here %s" % (sorted(tables), sorted(h for _, h in KEYWORD_TABLES.values()))
    for enum, (ops_name, host_name) in KEYWORD_TABLES.items():
        host = {k: c_facts[expr] for k, expr in tables[host_name]}
        want = {k.lower(): c_facts[e] for e in header_enums()[enum]
                for k in [e[len(ENUM_PREFIX[enum]):]]}
        assert host == want, "_host.c %s %s, lmk.h's %s %s" % (host_name, host, enum, want)
        assert getattr(_ops, ops_name) == want, "_ops.%s %s, lmk.h's %s %s" % (ops_name, getattr(_ops, ops_name),
                                                                              enum, want)


def test_status_names_and_dtype_sizes_are_the_librarys():
    """The loaded liblmk's own answers (no compiler needed): lmk_status_name of every status the package
    names, one past them unknown, and lmk_dtype_size of every dtype."""
    for value, name in _lib.STATUS_NAMES.items():
        assert _lib.status_name(value).decode() == name
    assert _lib.status_name(max(_lib.STATUS_NAMES) + 1).decode() == "LMK_UNKNOWN_STATUS", \
        "liblmk names a status the package does not know"
    for dtype, size in _lib.DTYPE_SIZES.items():
        assert _lib.dtype_size(dtype) == size, "dtype %d: liblmk %d bytes, the package %d" % (
            dtype, _lib.dtype_size(dtype), size)

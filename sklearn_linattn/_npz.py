"""Reading ``.npz`` files that are not trusted: every member checked before its data is read.

Used for model files and the command line's data files (see the user guide's FAQ).
"""

import collections
import math
import os
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy_format

from ._memory import resolve_budget

__all__ = ["NpzReader", "gib", "load_arrays"]

# Text members of model files (the format tag, the solver name, the JSON
# parameters) are tiny; anything longer is not a file the package wrote.
_MAX_TEXT_CHARS = 2**16
# What a message quotes of a corrupt header or text, at most.
_QUOTE_CHARS = 200
# The data of a large member is copied in pieces of this size, so reading
# never needs a second full-size buffer.
_READ_CHUNK = 2**24
# Zip damage surfaces as any of these, from the directory or a member stream.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
               ValueError, OSError)


def gib(n_bytes):
    """A number of bytes in GiB, for messages."""
    return f"{n_bytes / 2**30:.3g} GiB"


class NpzReader:
    """An ``.npz`` archive read member by member: each :meth:`header` checked before its data.

    ``entries`` maps each key (member name without ``.npy``) to its :class:`zipfile.ZipInfo`.
    """

    def __init__(self, path, what):
        self.path = os.fsdecode(os.fspath(path))
        self.what = what
        self._zip = None
        if os.path.isdir(self.path):
            raise ValueError(f"{self.path} is a directory, not {what}.")
        self._file = open(self.path, "rb")  # FileNotFoundError/PermissionError as they are
        try:
            magic = self._file.read(6)
            if magic == b"\x93NUMPY":
                raise ValueError(
                    f"{self.path} is a single .npy array, not {what} (an .npz archive, "
                    "as written by numpy.savez)."
                )
            self._file.seek(0)
            try:
                self._zip = zipfile.ZipFile(self._file)
                infos = self._zip.infolist()
            except _ZIP_ERRORS as exc:
                raise ValueError(
                    f"{self.path} is not a readable .npz file: not a zip archive ({exc})."
                ) from None
            keys = [info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                    for info in infos]
            # numpy.load would keep only the last of two equal names; which
            # one a reader sees must not depend on that.
            repeated = sorted(k for k, n in collections.Counter(keys).items() if n > 1)
            if repeated:
                raise ValueError(
                    f"{self.path} is a corrupt .npz file: the entries {repeated} appear "
                    "more than once in its zip directory."
                )
            self.entries = dict(zip(keys, infos))
            self._headers = {}
        except BaseException:
            self._file.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self._zip is not None:
            self._zip.close()
        self._file.close()

    def _error(self, key, message):
        return ValueError(f"{self.path}: entry {key!r} {message}")

    def header(self, key):
        """``(shape, dtype, fortran_order, data_offset)`` of member ``key``, checked.

        The declared size must be the member's size, and the dtype plain values.
        """
        if key in self._headers:
            return self._headers[key]
        info = self.entries[key]
        if not info.filename.endswith(".npy"):
            raise self._error(key, "is not a .npy array.")
        try:
            with self._zip.open(info) as stream:
                version = npy_format.read_magic(stream)
                if version == (1, 0):
                    shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
                elif version == (2, 0):
                    shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
                else:
                    raise ValueError(f"unsupported .npy format version {version}")
                offset = stream.tell()
        except _ZIP_ERRORS as exc:
            raise self._error(key, f"has a corrupt .npy header ({_quote(exc)}).") from None
        if (dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None
                or dtype.itemsize == 0):
            raise self._error(
                key, f"holds an array of dtype {dtype}; model and data files hold plain "
                "numbers and text only (object arrays would need pickle, which is never "
                "loaded)."
            )
        n_bytes = math.prod(shape) * dtype.itemsize
        if offset + n_bytes != info.file_size:
            raise self._error(
                key, f"declares an array of shape {shape} and dtype {dtype} "
                f"({n_bytes} bytes of data after a {offset}-byte header), but the member "
                f"holds {info.file_size} bytes: the file is corrupt."
            )
        self._headers[key] = (shape, dtype, fortran, offset)
        return self._headers[key]

    def read(self, key):
        """The array of member ``key``; call after checking :meth:`header`."""
        shape, dtype, fortran, offset = self.header(key)
        count = math.prod(shape)
        out = np.empty(count, dtype=dtype)
        view = memoryview(out.view(np.uint8).reshape(-1))
        try:
            with self._zip.open(self.entries[key]) as stream:
                stream.read(offset)
                pos = 0
                while pos < len(view):
                    chunk = stream.read(min(_READ_CHUNK, len(view) - pos))
                    if not chunk:
                        raise EOFError("the data ends early")
                    view[pos:pos + len(chunk)] = chunk
                    pos += len(chunk)
                # Reading to the end makes zipfile verify the CRC.
                if stream.read(1):
                    raise ValueError("data continues past the declared array")
        except _ZIP_ERRORS as exc:
            raise self._error(key, f"has corrupt data ({exc}).") from None
        if fortran:
            return out.reshape(shape[::-1]).transpose()
        return out.reshape(shape)

    def scalar(self, key, kind):
        """A 0-d member of ``kind`` "int", "bool", "float" or "str", as a Python value."""
        shape, dtype, _, _ = self.header(key)
        kinds = {"int": "iu", "bool": "b", "float": "f", "str": "U"}[kind]
        names = {"int": "an integer", "bool": "a boolean", "float": "a floating-point number",
                 "str": "a text string"}
        if shape != () or dtype.kind not in kinds:
            raise self._error(
                key, f"must be {names[kind]} scalar; found an array of shape {shape} and "
                f"dtype {dtype}."
            )
        if kind == "str" and dtype.itemsize > 4 * _MAX_TEXT_CHARS:
            raise self._error(
                key, f"must be a text of at most {_MAX_TEXT_CHARS} characters; found "
                f"dtype {dtype}."
            )
        value = self.read(key)[()]
        return {"int": int, "bool": bool, "float": float, "str": str}[kind](value)


def load_arrays(path, required, optional=(), *, memory_budget=None):
    """Read the named arrays of a data ``.npz`` with the same checks as model files.

    ``required`` keys must be present, ``optional`` ones are read when they
    are.  Object arrays are refused, and the arrays' total declared size must
    fit in ``memory_budget`` bytes (None: half the physical memory).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from sklearn_linattn._npz import load_arrays
    >>> path = os.path.join(tempfile.mkdtemp(), "data.npz")
    >>> np.savez(path, X=np.zeros((4, 3, 2)))
    >>> sorted(load_arrays(path, ["X"], ["y"]))
    ['X']
    """
    budget = resolve_budget(memory_budget)
    path = os.fspath(path)
    with NpzReader(path, "a data file") as reader:
        missing = [k for k in required if k not in reader.entries]
        if missing:
            raise ValueError(
                f"{path} has no array named {missing[0]!r} (it has {sorted(reader.entries)})."
            )
        keys = list(required) + [k for k in optional if k in reader.entries]
        sizes = {}
        for key in keys:
            shape, dtype, _, _ = reader.header(key)
            sizes[key] = math.prod(shape) * dtype.itemsize
        if sum(sizes.values()) > budget:
            listing = ", ".join(
                f"{k} {reader.header(k)[0]} {reader.header(k)[1]} ({gib(n)})"
                for k, n in sizes.items()
            )
            raise ValueError(
                f"{path}: the arrays {listing} need {gib(sum(sizes.values()))}, more than "
                f"the memory budget of {gib(budget)} (half the physical memory)."
            )
        return {key: reader.read(key) for key in keys}


def _quote(exc):
    """An exception's text, cut to ``_QUOTE_CHARS`` (numpy quotes a whole corrupt header)."""
    text = str(exc)
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."

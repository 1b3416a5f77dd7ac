"""Write the offline intersphinx inventories that ``doc/conf.py`` reads.

The docs build runs without network access, so it cannot download the
``objects.inv`` of NumPy, SciPy, scikit-learn and Python.  This script lists,
for each of them, only the targets that our docs link to -- from the
docstrings, the ``.rst`` pages, the numpydoc parameter types
(``numpydoc_xref_param_type``) and the gallery's code links -- with their URLs
in that project's published documentation, and writes them as Sphinx
inventories (format version 2, zlib-compressed) beside this file:
``python.inv``, ``numpy.inv``, ``scipy.inv`` and ``sklearn.inv``.

To link a new target: add it to ``INVENTORIES`` below (a nitpicky build,
``sphinx-build -n``, lists the references that do not resolve), run::

    python doc/_intersphinx/make_inventories.py

and commit the changed ``.inv`` files.  ``--check`` only verifies that the
files hold exactly the entries listed here (exit status 1 otherwise).

Each entry is ``(name, "domain:role", uri, display name)``: ``uri`` is
relative to the project's base URL in ``intersphinx_mapping``, and each
``$`` in it stands for ``name`` (the file stores Sphinx's own shorthand, a
trailing ``$`` for an anchor equal to the name); a display name of ``-``
means the name itself.
"""

import argparse
import pathlib
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent

_NP_GEN = _SP_GEN = "reference/generated/$.html#$"
_SK_GEN = "modules/generated/$.html#$"


def _generated(uri, names, role):
    """Entries for objects that have a page of their own, all at ``uri``."""
    return [(name, role, uri, "-") for name in names]


#: project -> (project name, entries); URLs relative to the base URL of
#: ``intersphinx_mapping`` in conf.py.
INVENTORIES = {
    "python": (
        "Python",
        [
            # numpydoc's default aliases for parameter types.
            ("None", "py:data", "library/constants.html#$", "-"),
            ("True", "py:data", "library/constants.html#$", "-"),
            ("False", "py:data", "library/constants.html#$", "-"),
            ("int", "py:class", "library/functions.html#$", "-"),
            ("float", "py:class", "library/functions.html#$", "-"),
            ("str", "py:class", "library/stdtypes.html#$", "-"),
            ("list", "py:class", "library/stdtypes.html#$", "-"),
            ("tuple", "py:class", "library/stdtypes.html#$", "-"),
            ("dict", "py:class", "library/stdtypes.html#$", "-"),
            ("callable", "py:function", "library/functions.html#$", "-"),
            ("bltin-boolean-values", "std:label", "library/stdtypes.html#$",
             "Boolean Type - bool"),
            ("iterable", "std:term", "glossary.html#term-iterable", "-"),
            # Aliases of conf.py's numpydoc_xref_aliases.
            ("hashable", "std:term", "glossary.html#term-hashable", "-"),
            ("mapping", "std:term", "glossary.html#term-mapping", "-"),
        ],
    ),
    "numpy": (
        "NumPy",
        [
            ("numpy", "py:module", "reference/index.html#module-numpy", "-"),
            ("array_like", "std:term", "glossary.html#term-array_like", "-"),
            ("numpy.ndarray", "py:class", "reference/generated/$.html#$", "-"),
            ("numpy.dtype", "py:class", "reference/generated/$.html#$", "-"),
            ("numpy.memmap", "py:class", "reference/generated/$.html#$", "-"),
            ("numpy.float32", "py:attribute", "reference/arrays.scalars.html#$", "-"),
            ("numpy.float64", "py:attribute", "reference/arrays.scalars.html#$", "-"),
            ("numpy.inf", "py:data", "reference/constants.html#$", "-"),
            ("numpy.nan", "py:data", "reference/constants.html#$", "-"),
            ("numpy.random.Generator", "py:class", "reference/random/generator.html#$", "-"),
            ("numpy.random.default_rng", "py:function",
             "reference/random/generator.html#$", "-"),
            ("numpy.random.RandomState", "py:class", "reference/random/legacy.html#$", "-"),
        ]
        # Functions the gallery's examples call (code links).
        + _generated(_NP_GEN, [
            "numpy.abs", "numpy.all", "numpy.arange", "numpy.array", "numpy.array_equal",
            "numpy.bincount", "numpy.concatenate", "numpy.divmod", "numpy.flatnonzero",
            "numpy.full", "numpy.linalg.norm", "numpy.linalg.qr", "numpy.logspace",
            "numpy.mean", "numpy.nanmax", "numpy.repeat", "numpy.sqrt", "numpy.tile",
            "numpy.where", "numpy.zeros",
        ], "py:function"),
    ),
    "scipy": (
        "SciPy",
        [
            ("scipy.sparse", "py:module", "reference/sparse.html#module-scipy.sparse", "-"),
            ("scipy.sparse.csr_matrix", "py:class", "reference/generated/$.html#$", "-"),
        ]
        + _generated(_SP_GEN, [
            "scipy.sparse.linalg.eigsh", "scipy.sparse.linalg.lobpcg",
            "scipy.sparse.linalg.lsmr",
        ], "py:function"),
    ),
    "sklearn": (
        "scikit-learn",
        [
            ("estimator", "std:term", "glossary.html#term-estimator", "-"),
        ]
        + _generated(_SK_GEN, [
            "sklearn.linear_model.RidgeCV", "sklearn.model_selection.GridSearchCV",
            "sklearn.model_selection.KFold", "sklearn.model_selection.GroupKFold",
            "sklearn.model_selection.TimeSeriesSplit", "sklearn.pipeline.Pipeline",
            "sklearn.preprocessing.OneHotEncoder", "sklearn.preprocessing.StandardScaler",
            # scikit-learn documents its exceptions as classes.
            "sklearn.exceptions.ConvergenceWarning",
        ], "py:class")
        + _generated(_SK_GEN, [
            "sklearn.metrics.get_scorer", "sklearn.metrics.make_scorer",
            "sklearn.metrics.mean_squared_error", "sklearn.model_selection.check_cv",
            "sklearn.model_selection.cross_val_score",
            "sklearn.model_selection.cross_validate", "sklearn.pipeline.make_pipeline",
        ], "py:function"),
    ),
}

_PRIORITY = {"std:label": "-1", "std:term": "-1", "py:module": "0"}


def _lines(entries):
    """The inventory lines, sorted as Sphinx writes them."""
    rows = []
    for name, role, uri, dispname in entries:
        if " " in name or " " in uri:
            raise ValueError(f"no spaces allowed in a name or URI: {name!r}, {uri!r}")
        uri = uri.replace("$", name)
        if uri.endswith("#" + name):  # Sphinx's shorthand: a trailing $ is the name
            uri = uri[: -len(name)] + "$"
        rows.append(f"{name} {role} {_PRIORITY.get(role, '1')} {uri} {dispname}\n")
    if len(set(rows)) != len(rows):
        raise ValueError("duplicate entries")
    return sorted(rows)


def _content(project, entries):
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        "# Version: \n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(_lines(entries))
    return header.encode(), body.encode()


def _read_body(path):
    data = path.read_bytes()
    head, sep, rest = data.partition(b"zlib.\n")
    if not sep:
        raise ValueError(f"{path} is not a version 2 inventory")
    return head + sep, zlib.decompress(rest)


def main(argv=None):
    """Write the inventories, or check them with ``--check``.

    Parameters
    ----------
    argv : list of str or None, default=None
        Command-line arguments; None reads ``sys.argv[1:]``.

    Returns
    -------
    int
        0 when the files were written or are up to date, 1 otherwise.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="verify the .inv files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for key, (project, entries) in INVENTORIES.items():
        path = HERE / f"{key}.inv"
        header, body = _content(project, entries)
        if args.check:
            if not path.is_file() or _read_body(path) != (header, body):
                stale.append(path.name)
            continue
        path.write_bytes(header + zlib.compress(body, 9))
        n_entries = body.count(b"\n")
        print(f"wrote {path.name}: {n_entries} entries")
    if stale:
        print("out of date (run doc/_intersphinx/make_inventories.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sphinx configuration for the sklearn-linattn documentation."""

import os
import re
import sys
import warnings

sys.path.insert(0, os.path.abspath(".."))

import sklearn_linattn  # noqa: E402

project = "sklearn-linattn"
author = "the sklearn-linattn developers"
copyright = "2026, the sklearn-linattn developers"
release = sklearn_linattn.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

autosummary_generate = True
autodoc_default_options = {"members": True, "inherited-members": True}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# -- numpydoc: parameter types as links ---------------------------------------
# Only the names below (and numpydoc's own aliases: int, float, str, bool,
# None, list, tuple, dict, callable, ndarray, array-like, RandomState, ...) are
# linked; every other word of a type ("of", "shape", "n_samples") stays text.
# Targets outside this package must be in the offline inventories
# (_intersphinx/make_inventories.py, below).
numpydoc_xref_param_type = True
numpydoc_xref_ignore = "all"
numpydoc_xref_aliases = {
    # This package's public classes, wherever a docstring names them.
    **{name: f"sklearn_linattn.{name}" for name in (
        "LinearAttentionRegressor", "LinearAttentionRegressorCV", "LinearAttentionFeatures",
        "AdamLinearAttentionRegressor", "IdentifiabilityCertificate", "Witness",
        "OptimalityReport",
    )},
    "MultiHeadLinearAttention": "sklearn_linattn.nn.MultiHeadLinearAttention",
    "PositionalEncoding": "sklearn_linattn.preprocessing.PositionalEncoding",
    **{name: f"sklearn_linattn.programs.{name}" for name in (
        "Program", "CompiledProgram", "DFAExecutor", "TuringMachineSimulator",
    )},
    "Generator": "numpy.random.Generator",
    "np.random.Generator": "numpy.random.Generator",
    "dtype": "numpy.dtype",
    "float64": "numpy.float64",
    "np.float64": "numpy.float64",
    "np.float32": "numpy.float32",
    "callable": ":func:`callable <python:callable>`",  # numpydoc's alias shows "callable()"
    "estimator": ":term:`sklearn:estimator`",
    "hashable": ":term:`python:hashable`",
    "mapping": ":term:`python:mapping`",
}

# -- numpydoc: docstring validation ---------------------------------------------
# The checks the build enforces; with -W each report fails the build.
#   PR01-PR10  the Parameters section matches the signature, with types and
#              descriptions;
#   RT01, RT03-RT05  a Returns section with described values.  RT02 ("only the
#              type on the first line") is not enforced: the scikit-learn
#              convention names single return values ("self : object",
#              "X_new : ndarray ..."), and scikit-learn's own docstring test
#              skips RT02 for that reason;
#   EX01       an Examples section (on methods too; a method that needs none
#              can say so on its def line: "def f(...):  # numpydoc ignore=EX01").
NUMPYDOC_CHECKS = {
    "PR01", "PR02", "PR03", "PR04", "PR05", "PR06", "PR07", "PR08", "PR09", "PR10",
    "RT01", "RT03", "RT04", "RT05",
    "EX01",
}
# Every public name is validated (those of api.rst and the members of its
# classes), except the names matched below.
numpydoc_validation_checks = NUMPYDOC_CHECKS
numpydoc_validation_exclude = {
    # Methods inherited from scikit-learn document scikit-learn.
    r"\.(get_params|set_params|fit_transform)$",
    r"\.(set_\w+_request|set_output|get_metadata_routing)$",
    # ... and those inherited from Python's exceptions (the warning classes) document Python.
    r"Warning\.(add_note|with_traceback)$",
}

# -- Intersphinx, offline ---------------------------------------------------------
# The build has no network, so it never downloads an objects.inv: each
# inventory is a small file in _intersphinx/ holding only the targets these
# docs link to, written by _intersphinx/make_inventories.py (to link a new
# target, add it there and rerun it).
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", "_intersphinx/python.inv"),
    "numpy": ("https://numpy.org/doc/stable/", "_intersphinx/numpy.inv"),
    "scipy": ("https://docs.scipy.org/doc/scipy/", "_intersphinx/scipy.inv"),
    "sklearn": ("https://scikit-learn.org/stable/", "_intersphinx/sklearn.inv"),
}

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "matplotlib_animations": False,
    # Back-references: the examples that use each public object, shown on
    # its API page by the minigallery directive of _templates/autosummary/.
    "doc_module": ("sklearn_linattn",),
    "backreferences_dir": "generated",
}

templates_path = ["_templates"]
exclude_patterns = ["_build", "_intersphinx"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "Linear attention, learned exactly"}

# Matplotlib in the gallery runs headless.
os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")


try:
    import torch
except ImportError:
    _TORCH_MODULE = {}
else:
    _TORCH_MODULE = {**dict.fromkeys(vars(torch.nn.Module).get("__annotations__", {})),
                     **vars(torch.nn.Module)}


def _skip_sklearn_generated(app, what, name, obj, skip, options):
    # scikit-learn's generated metadata-routing setters (set_*_request) and
    # set_output / get_metadata_routing document scikit-learn, not this package.
    if re.fullmatch(r"set_\w+_request|set_output|get_metadata_routing", name):
        return True
    # What sklearn_linattn.nn.MultiHeadLinearAttention inherits from
    # torch.nn.Module documents PyTorch (forward and the overrides stay).
    if name in _TORCH_MODULE and (_TORCH_MODULE[name] is None or _TORCH_MODULE[name] is obj):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_sklearn_generated)

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
# Cross-references to numpy / sklearn types in docstrings are best effort.
numpydoc_xref_param_type = False

intersphinx_mapping = {}  # no network at build time: keep the build offline

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "matplotlib_animations": False,
}

templates_path = ["_templates"]
exclude_patterns = ["_build", "generated/*.examples"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "Linear attention, learned exactly"}

# Matplotlib in the gallery runs headless.
os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")


def _skip_sklearn_generated(app, what, name, obj, skip, options):
    # scikit-learn's generated metadata-routing setters (set_*_request) and
    # set_output / get_metadata_routing document scikit-learn, not this package.
    if re.fullmatch(r"set_\w+_request|set_output|get_metadata_routing", name):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_sklearn_generated)

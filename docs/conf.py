"""Sphinx configuration of the dpsc documentation."""

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # benchmark_tables: the tables built from the rows

# sphinx-autodoc-typehints still calls Sphinx APIs that Sphinx 10 removes; the deprecation notes
# concern that extension, not these docs, so they are kept out of the build log.
warnings.filterwarnings("ignore", message=".*RemovedInSphinx10Warning.*")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="sphinx_autodoc_typehints")
try:
    from sphinx.deprecation import RemovedInSphinx10Warning

    warnings.filterwarnings("ignore", category=RemovedInSphinx10Warning)
except ImportError:  # an older or newer Sphinx without this class
    pass

project = "dpsc"
author = "dpsc developers"
extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx_autodoc_typehints",
    "benchmark_tables",
]
autosummary_generate = True
autodoc_default_options = {
    "members": True,
    "inherited-members": False,
    # scikit-learn adds metadata-routing methods whose docstrings reference its own docs.
    "exclude-members": "set_fit_request,set_predict_request,set_score_request",
}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath"]
html_theme = "furo"
exclude_patterns = ["_build", "_generated", "jupyter_execute", "**/.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]
nitpicky = False

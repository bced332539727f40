"""The one place that sets shardfeed's version.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), both packages re-export it as
``__version__``, and every manifest records it in ``created_by`` (``"shardfeed 0.1.0"``).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"

"""Every command, the top layer (docs/architecture.md "Folders and layers" names each module). The ``python -m``
entry points (``reportgen/__main__.py``, ``sign.py``, ``keys.py``, each package's ``__main__.py``) only import from
here or from the module that defines their command."""

"""The yarnflow version, defined once: the client's ``yarnflow.__version__``, ``yarnflow
--version``, the Dispatcher's cluster info and setup.py (which reads this file without
importing the package) all report this constant. Change it here only."""

__version__ = "0.1.0"

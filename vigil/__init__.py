"""Vigil: GPU-cluster health checking and fault tolerance.

This package is the program: the ``vigil`` command line, the demos, the local launcher and the
operator views. What every part shares lives in ``vigil_core``, below everything else.
"""

from vigil_core import __version__ as __version__

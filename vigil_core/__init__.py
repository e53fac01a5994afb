"""The ground floor every part of Vigil stands on, importing none of them: the domain types that
cross from agent to controller (``signals``), names and addresses (``names``), mutual TLS
(``tls``, ``cert_reload``), configuration files (``config_file``), logging (``logs``), and two
small helpers (``waiting``, ``ports``). Layers (pyproject.toml, one import-linter contract):

    vigil (the program)  >  agent | controller | trainer_hooks  >  checks  >  gpus  >  protos  >  vigil_core
"""

__version__ = "0.1.0"

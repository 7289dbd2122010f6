"""Adapters that run existing RL frameworks as RollMux jobs.

* ``rollmux.integrations.trl``: TRL's ``GRPOTrainer`` (``RollMuxGRPOTrainer``).
* ``rollmux.integrations.checks``: checks of recorded phases (alternation per job, no
  two jobs' phases overlapping on a node).

Each adapter imports its framework, so import the submodule you need (``pip install
'rollmux[demo]'`` brings TRL).
"""

"""O-Researcher: multi-agent cooperative training with a simulation-first testbed.

The core package is backend-free: it never imports SimPy or calls torch.distributed.
Agent programs yield ops (:mod:`oresearcher.ops`); the simulator
(:mod:`oresearcher.sim`) and the torch.distributed backend (:mod:`oresearcher.backends`)
interpret them.
"""
__version__ = "0.1.0"

"""torch.optim.Optimizer subclasses: Muon, MOP, SOAP."""

from optim.optimizers.base import NonFiniteError, NonFiniteWarning
from optim.optimizers.muon import Muon

__all__ = ["Muon", "NonFiniteError", "NonFiniteWarning"]

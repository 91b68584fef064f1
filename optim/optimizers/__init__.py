"""torch.optim.Optimizer subclasses: Muon, MOP, SOAP."""

from optim.optimizers.base import NonFiniteError, NonFiniteWarning
from optim.optimizers.mop import MOP
from optim.optimizers.muon import Muon
from optim.optimizers.soap import SOAP

__all__ = ["MOP", "SOAP", "Muon", "NonFiniteError", "NonFiniteWarning"]

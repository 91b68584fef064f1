"""Pure tensor math: Newton-Schulz, exact polar factor, SOAP/KL-Shampoo helpers."""

from optim.functional.newton_schulz import COEFFICIENT_SETS, newton_schulz, ns_coefficients
from optim.functional.polar import polar_svd

__all__ = ["COEFFICIENT_SETS", "newton_schulz", "ns_coefficients", "polar_svd"]

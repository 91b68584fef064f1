"""Pure tensor math: newton_schulz (NS and Gram-NS), polar (exact SVD polar factor), split (fused-row blocks),
soap_math (SOAP / KL-Shampoo helpers).

Import from the submodules (`from optim.functional.newton_schulz import newton_schulz`); this package does not
re-export functions under its submodules' names, so `import optim.functional.newton_schulz as ns` is the module.
"""

"""Results, apart from the run path: the run record (`record`), one table from many runs (`collect`), the markdown
report and its figures (`report`, `plots`), and the check against golden rows (`regress`). Nothing here imports
torch or Megatron at module top, so a login node or laptop can tabulate runs."""

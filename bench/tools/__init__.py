"""Other tools users run: FLOP counts, load balance, performance model, quality, NS kernels, optimizer step."""

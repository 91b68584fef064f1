"""muonbench optim."""

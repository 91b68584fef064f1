"""muonbench bench."""

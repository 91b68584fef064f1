"""muonbench recipes."""

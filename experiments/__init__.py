"""Research diagnostics: each folder asks one question, has a README and tests, and may import the product."""

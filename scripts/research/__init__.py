"""Research scripts behind docs/quality.md: the heads' step-0 diagnosis and scores along weight interpolations."""

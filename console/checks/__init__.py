"""Pre-flight checks of a deployment plan: one module per concern, run by ``runner.run_checks``."""

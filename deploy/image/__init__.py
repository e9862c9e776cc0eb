"""The container image: its build scripts and a smoke test that runs them without Docker."""

"""Load testing and benchmarking: a locust file, a headless locust runner, and `bench`."""

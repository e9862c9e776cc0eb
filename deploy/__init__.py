"""Deployment: the image build steps and their smoke test, Kubernetes manifests, compose."""

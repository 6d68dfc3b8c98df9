"""Deployment tooling outside training: Kubernetes manifests."""

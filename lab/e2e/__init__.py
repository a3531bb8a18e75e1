"""The upstream Kubernetes e2e tests reproduced offline (issue 24): their rows and the
docs/e2e.md table generated from runs."""

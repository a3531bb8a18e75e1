# ebpflb: the README's two commands are `make demo` and `make test`; both run `make setup`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-unit test-kernel test-deploy image lint bench clean-kernel

setup:
	@./scripts/setup.sh

demo: setup
	$(PY) -m ebpflb.demo

# The whole suite: static checks, unit tests (no kernel), kernel tests (root, real programs).
test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-kernel: setup
	$(PY) -m pytest -q -m kernel

# The agent's image from deploy/Containerfile, on a base made from Debian's packages: no
# registry (scripts/build-image.sh). Installs mmdebstrap, buildah, podman, runc.
image:
	@./scripts/build-image.sh

# deploy/daemonset.yaml run with podman from that image (tests/deploy/).
test-deploy: setup image
	$(PY) -m pytest -q tests/deploy $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check ebpflb tests
	$(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/ebpflb bench maglev

# Removes anything a crashed test run may have left (namespaces, cgroups, pins named ebpflb*).
clean-kernel:
	$(PY) -m ebpflb.testing.leftovers --remove

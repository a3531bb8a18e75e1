# ebpflb: the README's two commands are `make demo` and `make test`; both run `make setup`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-unit test-kernel test-deploy image image-previous lint bench clean-kernel setup-kernels test-kernels test-kernels-ci test-kernels-e2e kernel-table e2e-table

setup:
	@./scripts/setup.sh

demo: setup
	$(PY) -m lab.demo

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

# The previous release's image (deploy/previous-release), built from its own tree, for the
# rolling update test.
image-previous:
	@./scripts/build-previous-image.sh

# deploy/base/daemonset.yaml run with podman from that image (tests/deploy/).
test-deploy: setup image image-previous
	$(PY) -m pytest -q tests/deploy $(PYTEST_ARGS)

# ruff, mypy, and the import contracts of pyproject.toml ([tool.importlinter]: the stages
# as layers, bcc and kubernetes each behind one package).
lint: setup
	$(VENV)/bin/ruff check ebpflb lab tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/ebpflb bench maglev

# Removes anything a crashed test run may have left (namespaces, cgroups, pins named ebpflb*).
clean-kernel:
	$(PY) -m lab.harness.leftovers --remove

# The kernel tests on other kernels: Debian's 5.10 and 6.1 (cached in /var/cache/ebpflb/kernels),
# each booted once under qemu with this machine's root shared read-only; JUnit and the logs in
# .ci/out/kernels/<version>/. KERNEL_TESTS narrows the selection (default: tests/kernel).
KERNELS ?= 5.10 6.1
KERNEL_TESTS ?=

setup-kernels: setup
	@./scripts/kernels/install.sh

test-kernels: setup-kernels
	nice -n 10 $(PY) -m lab.kernels run --kernels "$(KERNELS)" $(KERNEL_TESTS)

# CI's selection (lab/kernels/ci.py): the files testing what differs between
# kernels, on every line; the whole suite under emulation does not fit CI's 90 minutes.
test-kernels-ci: setup-kernels
	nice -n 10 $(PY) -m lab.kernels run --kernels "$(KERNELS)" --ci --vm-timeout 70

# The upstream e2e suite (tests/kernel/e2e) in both guests, for docs/e2e.md's 5.10 and 6.1
# columns: here 18.7 minutes on 6.1 and 20.0 on 5.10, both at once.
E2E_KERNELS_OUT ?= .ci/out/e2e-kernels
test-kernels-e2e: setup-kernels
	nice -n 10 $(PY) -m lab.kernels run --kernels "$(KERNELS)" --out $(E2E_KERNELS_OUT) \
		--vm-timeout 110 tests/kernel/e2e

# docs/kernels.md's kernel table from the last test-kernels run (and this machine's `make test`
# JUnit, .ci/out/junit.xml, when there is one).
kernel-table: setup
	$(PY) -m lab.kernels table --readme docs/kernels.md \
		$(if $(wildcard .ci/out/junit.xml),--host-junit .ci/out/junit.xml)

# docs/e2e.md's table of the upstream e2e tests (tests/kernel/e2e), from make test's JUnit
# report (CI's, .ci/out/junit.xml) and the kernel matrix's where they ran there.
e2e-table: setup
	$(PY) -m lab.e2e table --doc docs/e2e.md --kernels-out $(E2E_KERNELS_OUT) \
		$(if $(wildcard .ci/out/junit.xml),--host-junit .ci/out/junit.xml)

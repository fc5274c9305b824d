# Developer entry points. `make test` is the whole test suite, exactly as CI runs it
# (.ci/run calls it); it builds what it needs on a fresh machine.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: all venv deps cluster-binaries image image-check chart-sync lint typecheck unit test bench clean

all: test

# The virtual environment with the package (editable) and its development tools. The target is
# a stamp of its own, not $(BIN)/fabricdra: README's first command makes a venv with the package
# alone, and that file would otherwise pass for a venv that has ruff, mypy and pytest.
DEV_STAMP := $(VENV)/.fabricdra-dev
$(DEV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

venv: $(DEV_STAMP)

# Debian packages the cluster harness needs (openssl, runc's libseccomp, CNI plugins, ...).
deps:
	e2e/cluster/install-deps.sh

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, containerd, runc and
# helm: built from the Go module proxy into ~/.cache/fabricdra (reused when already there).
cluster-binaries: deps
	e2e/cluster/build.sh --all

# The fabricdra image, Docker-free (mmdebstrap + umoci): build/image/fabricdra-image.tar, one OCI
# image index with linux/amd64 and linux/arm64 (the foreign one needs qemu-user-static), then
# checked: both platforms listed, native extensions of each image's machine, arm64 smoke run.
# CI and the e2e harness build only the host's platform (build.sh --platform linux/amd64).
image: deps
	deployments/container/build.sh
	deployments/container/check-multiarch.sh

# Build the image twice and compare digests (exit 1, listing the differing files, if not equal).
image-check: deps
	deployments/container/check-reproducible.sh

# The chart's copy of api/crds and the DeviceClasses generated from api/fabricdra/api/
# deviceclass_table.py (unit tests fail when they drift).
chart-sync: venv
	PYTHON=$(BIN)/python charts/fabricdra/sync-api.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# The unit tier needs nothing (no cluster, no helm, no network) and runs on every core.
# Bytecode is cached even where the environment sets PYTHONDONTWRITEBYTECODE (this machine's
# does): without it each xdist worker rewrites the asserts of every test module (3 s of CPU
# each) and every `python -m fabricdra...` a test starts compiles the package from source.
# worksteal: an idle worker takes tests queued on the other instead of waiting for it.
# TMPDIR on a tmpfs where there is one (as bench/startup.py): the tests write ~25,000 sysfs
# files (trees laid out as the kernel's) and unpack the sample node; on this VM's ext4 /tmp
# that was 8 s of system time in three test files alone, on /dev/shm under 1 s. A run's folders
# (530 MB of memory there) are kept only for the tests that failed.
# One worker more than cores: about a third of the tier's wall clock is the deadline tests'
# real waits (a hung tool's timeout, a frozen peer on the checkpoint lock), which leave a core
# idle; on this 2-core VM `-n 2` took 41-47 s, `-n 3` 32.5 s, `-n 4` 34 s.
UNIT_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
UNIT_TMPDIR ?= $(shell test -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})
unit: venv
	PYTHONDONTWRITEBYTECODE= TMPDIR=$(UNIT_TMPDIR) $(BIN)/pytest tests/unit -n $(UNIT_WORKERS) \
	  --dist worksteal -o tmp_path_retention_policy=failed $(PYTEST_ARGS)

# Everything: lint, strict typing, unit tests, integration tests against a real control plane
# and end-to-end tests against a real kubelet + containerd node.
test: lint typecheck cluster-binaries
	$(BIN)/pytest $(PYTEST_ARGS)

bench: venv cluster-binaries
	$(BIN)/python -m bench.discovery
	$(BIN)/python -m bench.startup
	$(BIN)/python -m bench.prepare
	$(BIN)/python -m bench.controller
	$(BIN)/python -m bench.fleet
	$(BIN)/python -m bench.e2e

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Vigil's everyday commands. Each target makes its own virtual environment on first use, so a
# fresh clone needs nothing but Python 3.11+ and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo demo-training test check lint protos config-examples bench scenarios images clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Runtime only: what `vigil demo` needs. No torch: nothing installed here pulls it in.
$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Runtime plus the checks' workloads, and the test, lint and code-generation tools. torch is pinned
# to the CPU build first, on purpose: an unpinned torch would pull several GB of CUDA packages.
TORCH ?= torch==2.13.0
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q '$(TORCH)'
	$(BIN)/pip install -q -e '.[dev,checks,train,adapters]'
	touch $@ $(VENV)/.runtime

demo: $(VENV)/.runtime  ## a local cluster: controller + 4 agents, an XID 79, Vigil acting on it
	$(BIN)/vigil demo

demo-training: $(VENV)/.dev  ## the bundled MoE job on 3 simulated nodes: a GPU fault and a slow rank, Vigil bringing it back
	$(BIN)/vigil demo --with-training

# Three workers: most end-to-end tests and scenarios wait on processes (two kept 2 cores 70 % busy).
# Tests on network namespaces share one subnet and run in one worker (xdist_group "netns"); tests
# judged by timings (marker serial) run after the rest, alone.
test: $(VENV)/.dev  ## the whole test suite
	$(BIN)/pytest -n 3 --dist loadgroup -m "not serial" --durations 25; parallel=$$?; \
	$(BIN)/pytest -m serial; serial=$$?; \
	test $$parallel -eq 0 -a $$serial -eq 0

check: $(VENV)/.dev  ## the edit loop (about a minute): lint, types, contracts, and the unit tests
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q -x tests/unit

lint: $(VENV)/.dev  ## style, types, and the layering contracts (pyproject.toml [tool.importlinter])
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

protos: $(VENV)/.dev  ## regenerate the committed protobuf/gRPC code from protos/vigil/v1/*.proto
	$(BIN)/python -m protos.generate

config-examples: $(VENV)/.dev  ## rewrite deploy/controller.example.yaml and deploy/agent.example.yaml from the models
	$(BIN)/python -m vigil.config_examples

scenarios: $(VENV)/.dev  ## the labelled fault scenarios through real processes, and their scorecard
	$(BIN)/python -m bench.scenarios

bench: $(VENV)/.dev  ## benchmarks; each prints its figures and appends them to bench/results/
	$(BIN)/python -m bench.demo_latency
	$(BIN)/python -m bench.agent_footprint
	$(BIN)/python -m bench.fault_to_action
	$(BIN)/python -m bench.sweep
	$(BIN)/python -m bench.checkpoint

# The container images (deploy/image/Dockerfile), pushed to REGISTRY; needs docker with buildx.
REGISTRY ?=
VERSION  ?= 0.1.0
TORCH_ARGS = $(if $(TORCH),--build-arg TORCH=$(TORCH)) $(if $(TORCH_INDEX),--build-arg TORCH_INDEX=$(TORCH_INDEX))
images:  ## build and push every image the manifests name: make images REGISTRY=registry.example.com/vigil
	@test -n "$(REGISTRY)" || { echo "make images needs REGISTRY=<your registry>/<path>"; exit 2; }
	docker build -f deploy/image/Dockerfile --target controller -t $(REGISTRY)/vigil-controller:$(VERSION) .
	docker build -f deploy/image/Dockerfile --target agent $(TORCH_ARGS) -t $(REGISTRY)/vigil-agent:$(VERSION) .
	docker build -f deploy/image/Dockerfile --target train $(TORCH_ARGS) -t $(REGISTRY)/vigil-train:$(VERSION) .
	docker push $(REGISTRY)/vigil-controller:$(VERSION)
	docker push $(REGISTRY)/vigil-agent:$(VERSION)
	docker push $(REGISTRY)/vigil-train:$(VERSION)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

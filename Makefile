# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo_output
# Keep TensorFlow's C++ log noise out of what the user reads.
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

test: install
	$(PY) -m pytest -q tests

demo: install
	$(PY) -m estimator_tpu.datasets digits $(DEMO)/images
	$(PY) preprocess.py --input_dir=$(DEMO)/images --output_dir=$(DEMO)/data --overwrite
	@echo "demo: data generation and preprocessing done; training arrives with train.py"

clean:
	rm -rf $(DEMO)

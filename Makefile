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

# The whole workflow on the bundled digits: JPEG folders -> Beam -> TFRecords ->
# TPUEstimator on CPU (exact eval each 200 steps) -> SavedModel -> batch predictions.
demo: install
	rm -rf $(DEMO)
	$(PY) -m estimator_tpu.datasets digits $(DEMO)/images
	$(PY) preprocess.py --input_dir=$(DEMO)/images --output_dir=$(DEMO)/data
	$(PY) train.py --data_dir=$(DEMO)/data --model_dir=$(DEMO)/model \
	  --image_size=32 --norandom_flip --train_steps=800 --steps_per_eval=200 \
	  --train_batch_size=64 --eval_batch_size=64 --export_dir=$(DEMO)/export
	$(PY) -m serving.predict --saved_model=$(DEMO)/export \
	  --input='$(DEMO)/data/validation-*' --output=$(DEMO)/predictions.csv

clean:
	rm -rf $(DEMO)

# The two commands a fresh machine needs: `make demo` and `make test`.
# STACK=current (default): Python 3.12, TensorFlow 2.21 + tf-estimator-nightly, in .venv.
# STACK=tf2.15: Python 3.11, TensorFlow 2.15.1 + tensorflow-estimator 2.15.0, in .venv-tf2.15.
# STACK=tpu: Python 3.12, TensorFlow 2.20's TPU build (tensorflow-tpu + libtpu) + tf-estimator-nightly,
#   in .venv-tpu: the stack for PJRT TPU VMs (v5e, v6e); on a host without a TPU it runs as CPU TensorFlow.
# STACK=gpu: Python 3.12, the current stack with the `tensorflow` wheel (it lowers steps for CUDA) and
#   jax[cuda13] (--engine=jax on NVIDIA GPUs), in .venv-gpu; on a host without a GPU JAX runs on the CPU.
#   Not part of `.ci/run` (several GB of CUDA wheels).
STACK ?= current
ifeq ($(STACK),current)
  PYTHON_VERSION := 3.12
  VENV := .venv
else ifeq ($(STACK),tf2.15)
  PYTHON_VERSION := 3.11
  VENV := .venv-tf2.15
else ifeq ($(STACK),tpu)
  PYTHON_VERSION := 3.12
  VENV := .venv-tpu
else ifeq ($(STACK),gpu)
  PYTHON_VERSION := 3.12
  VENV := .venv-gpu
else
  $(error STACK=$(STACK) is not a stack: use STACK=current (the default), STACK=tf2.15, STACK=tpu or STACK=gpu)
endif
LOCK := requirements/$(STACK).lock
PY := $(VENV)/bin/python
DEMO := demo_output$(if $(filter current,$(STACK)),,-$(STACK))
# Keep TensorFlow's C++ log noise out of what the user reads.
export TF_CPP_MIN_LOG_LEVEL ?= 3
# Python may write the bytecode of what it imports into the venv (installs skip compiling: see
# below). With PYTHONDONTWRITEBYTECODE=1 in the environment (as on this project's CI machines) and
# no bytecode in a fresh venv, every process compiled TensorFlow's and JAX's sources again as it
# imported them: `import estimator_tpu, tensorflow, jax` cost 14-17 CPU s instead of 4.5-5.4, in
# each pytest worker, zygote and fresh program.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo demo-run test lint install install-stacks clean

install: $(VENV)/.installed

# The venvs of the three stacks `.ci/run` tests, made at once (each suite reads the other stacks'
# venvs: tests/test_cross_stack.py): pip spends much of an install waiting on the disk, and three
# side by side took 118 s on 2 cores where one after another took 235 s.
install-stacks:
	@$(MAKE) --no-print-directory -j3 install-stack-current install-stack-tf2.15 install-stack-tpu

install-stack-%:
	@$(MAKE) --no-print-directory install STACK=$*

# A venv of another Python version (an older checkout's .venv) is made anew. The tpu stack's venv
# gets a start-up file that keeps libtpu off the cloud metadata server on hosts without a TPU, for
# programs that import TensorFlow before estimator_tpu too (estimator_tpu/libtpu_guard.py).
# --no-compile: Python compiles a module when it is first imported, not every module of the lock at
# install time (the current lock: 60 s instead of 102 s on 2 cores).
$(VENV)/.installed: $(LOCK) pyproject.toml
	@python=$${PYTHON:-$$(scripts/find_python.sh $(PYTHON_VERSION))} || exit 1; \
	if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != ($(subst .,$(comma),$(PYTHON_VERSION))))' 2>/dev/null; then \
	  rm -rf $(VENV) && echo "creating $(VENV) with $$python" && $$python -m venv $(VENV) || exit 1; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-compile -r $(LOCK)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(if $(filter tpu,$(STACK)),$(PY) -c 'from estimator_tpu import libtpu_guard; libtpu_guard.write_startup_file()')
	scripts/pip_check.sh $(PY)
	touch $@

# One pytest worker more than the cores, at most 4 (each loads TensorFlow and its own fixtures): a
# worker waits now and then (on a program's start, a test's sleep, and on the tpu stack 5 s for a
# TPU platform in each process that loads TensorFlow afresh), and the third keeps 2 cores busy
# meanwhile (the default stack's whole suite: 98.6% of both cores, 15 min 13 s; with a worker per
# core ~92%, 16 min 12 s). A test file goes to one worker whole, so its module fixtures (trained
# models, written data sets) are made once, the longest files first (tests/durations.json;
# --no-loadscope-reorder keeps that order).
# SLOW=no leaves out the end-to-end runs marked `slow` (faults, resumes, pods, Beam, the demo):
# CI runs them on the default stack and the rest of the suite on every stack.
WORKERS := $(shell n=$$(nproc); echo $$(( n < 4 ? n + 1 : 4 )))
SLOW ?= yes
test: install
	$(PY) -m pytest -q -n $(WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder $(if $(filter no,$(SLOW)),-m "not slow") tests

lint: install
	$(PY) -m ruff check .

# The whole workflow on the bundled digits: JPEG folders -> Beam -> TFRecords ->
# TPUEstimator on CPU (exact eval each 200 steps) -> SavedModel -> batch predictions.
# `demo-run` is the same without the install (tests run it short, with their own PY and DEMO).
DEMO_STEPS ?= 800
DEMO_EVAL_STEPS ?= 200
DEMO_LIMIT ?=
demo: install
	@$(MAKE) --no-print-directory demo-run

demo-run:
	rm -rf $(DEMO)
	$(PY) -m estimator_tpu.data.digits digits $(DEMO)/images $(if $(DEMO_LIMIT),--limit=$(DEMO_LIMIT))
	$(PY) preprocess.py --input_dir=$(DEMO)/images --output_dir=$(DEMO)/data
	$(PY) train.py --data_dir=$(DEMO)/data --model_dir=$(DEMO)/model \
	  --image_size=32 --norandom_flip --train_steps=$(DEMO_STEPS) --steps_per_eval=$(DEMO_EVAL_STEPS) \
	  --train_batch_size=64 --eval_batch_size=64 --export_dir=$(DEMO)/export
	$(PY) -m serving.predict --saved_model=$(DEMO)/export \
	  --input='$(DEMO)/data/validation-*' --output=$(DEMO)/predictions.csv

clean:
	rm -rf demo_output demo_output-*

comma := ,

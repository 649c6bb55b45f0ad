"""The gateway: one OpenAI-compatible endpoint in front of every deployment's router.

    python -m inference.gateway --host 127.0.0.1 --port 8090 --config-file PATH

Each request goes to a deployment's router by its ``model`` (a served model name, or an alias
with fallback targets); the gateway never talks to workers itself.
"""

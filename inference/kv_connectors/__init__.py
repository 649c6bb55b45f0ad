"""KV connector classes that vLLM workers load by module path (``kv_connector_module_path``).

They run inside the vLLM worker processes, never in the router or the console.
"""

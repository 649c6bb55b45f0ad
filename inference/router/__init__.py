"""pdserve's router: one OpenAI-compatible endpoint in front of prefill and decode pools."""

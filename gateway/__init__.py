"""The HTTP edge: OpenAI API, proxy, admin REST, health, metrics, CLI."""

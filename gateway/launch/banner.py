"""What both `warmgate up` fleets (simulated and vLLM) share: the banner printed once
everything answers, and the interruption that stops them."""

from __future__ import annotations


class Interrupted(Exception):
    """Ctrl-C or SIGTERM while starting or running."""


def banner_text(
    headline: str,
    base_url: str,
    model: str,
    details: list[str],
    *,
    call: str = "",
    notes: tuple[str, ...] = (),
) -> str:
    """What `warmgate up` prints once everything answers (simulated and vLLM fleets alike):
    where things are, then how to call it with the OpenAI SDK (`call`: arguments before
    `messages`)."""
    return "\n".join(
        [
            "",
            headline,
            f"  base URL:  {base_url}",
            f"  admin:     {base_url.removesuffix('/v1')}/admin/instances  /admin/stats  /metrics",
            *details,
            "",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{base_url}", api_key="unused")',
            f'  print(client.chat.completions.create(model="{model}", {call}messages=[{{"role": '
            '"user", "content": "Hello!"}]).choices[0].message.content)',
            "",
            *notes,
            "Ctrl-C stops everything.",
            "",
        ]
    )

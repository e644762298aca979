"""Typed parameters per routing policy, for `routing.params` (YAML, env, keywords).

Each policy's settings model is built from its constructor's keyword arguments (their
annotations and defaults: the policy owns them, nothing is copied here), refusing unknown
keys, so `routing: {policy: ttft, params: {tie_rel: 0.1, params: {prefill_per_token_s:
1e-4}}}` or `WARMGATE_ROUTING__PARAMS__TIE_REL=0.1` are checked and converted before the
policy is built, and a misspelt parameter is an error naming it. Arguments that are not
configuration (a clock) are left out.
"""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from router.policies.base import Policy
from router.policies.registry import default_registry

NOT_SETTINGS = frozenset({"clock"})  # constructor arguments that are wiring, not settings


def params_model(cls: type[Policy]) -> type[BaseModel]:
    """The settings model of one policy class's keyword arguments."""
    hints = get_type_hints(cls.__init__)
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or name in NOT_SETTINGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = ... if p.default is p.empty else p.default
        fields[name] = (hints[name], default)
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    model: type[BaseModel] = create_model(f"{cls.__name__}Params", __config__=config, **fields)
    return model


def validate_params(policy: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` checked and converted for `policy`; only the keys given are returned (the
    rest keep the policy's own defaults). Raises ValueError naming an unknown policy or a
    bad parameter."""
    model = params_model(default_registry().policy_class(policy))
    validated = model.model_validate(params)
    return {name: getattr(validated, name) for name in validated.model_fields_set}

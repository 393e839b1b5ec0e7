"""What a Hugging Face ``config.json`` may ask of reportgen before anything is built from it.

A planner or a tiny twin built from an edited or hostile config must not run until killed
(``num_hidden_layers: 1000000``), blame the wrong setting (a negative ``hidden_size`` reported as a
batch problem), run remote code (``auto_map``), or wait on transformers' interactive "run the
custom code? [y/N]" prompt. :func:`config_problem` states the first such problem in one line;
callers load the config with ``trust_remote_code=False`` so transformers never prompts.
"""

from __future__ import annotations

from typing import Any

#: Upper bounds of the sizes, far above every published model (Llama 3.1 405B: hidden 16384,
#: intermediate 53248, 128 heads, vocabulary 128256); the layer count's is ``plan.args.MAX_LAYERS``.
BOUNDS = {
    "hidden_size": 65536,
    "intermediate_size": 262144,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "vocab_size": 4_194_304,
    "max_position_embeddings": 4_194_304,
    "head_dim": 4096,
}


def config_problem(fields: dict[str, Any], where: str) -> str | None:
    """The first reason not to build anything from ``fields`` (a parsed config.json), or ``None``.

    Args:
        fields: the config's JSON object.
        where: how to name it in the message, e.g. ``"conf/plan/x/config.json"``.

    Returns:
        One sentence naming the field, its value, the bound and the fix; ``None`` when it is fine.
    """
    if not isinstance(fields, dict):
        return f"{where} is not a JSON object"
    if fields.get("auto_map"):
        return (
            f"{where} needs remote code (auto_map), which reportgen never downloads or runs; use an architecture "
            "built into transformers (model_type llama, mistral, qwen2, ...)"
        )
    for key, bound in BOUNDS.items():
        value = fields.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{where}: {key} is {value!r}; it must be a positive integer (at most {bound})"
        if value > bound:
            return (
                f"{where}: {key} is {value}, above the bound of {bound} that reportgen accepts (no published model "
                "comes near it); fix the config"
            )
    return None

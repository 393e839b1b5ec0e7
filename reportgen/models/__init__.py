"""Built-in models: ``ffn`` (tutorial block), ``mlp`` (digits) and ``gpt`` (character LM)."""

"""The generate stage: prompts → one SGLang server → completions (one worker per server)."""

"""The tokenize stage: completions → samples with loss masks → the shard sink (sinks/)."""

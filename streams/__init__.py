"""draftgen's streaming side: records, topics, the generate and tokenize agents, model families."""

import os

# We load tokenizers only, never models: transformers' "PyTorch was not found" advisory would be
# the first line of every command's output (and break the one-line error promise).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

"""draftgen's streaming side: records, topics, the generate and tokenize agents, model families."""

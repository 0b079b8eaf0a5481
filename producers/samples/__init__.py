"""Bundled sample prompts (a package only so that setuptools ships the JSONL as package data)."""
